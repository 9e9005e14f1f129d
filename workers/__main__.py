from plexmq.workers.worker import main

main()
