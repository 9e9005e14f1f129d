from plexmq.router.main import main

main()
