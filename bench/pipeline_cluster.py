"""`python -m bench.pipeline_cluster`: the traffic job on a Spark standalone cluster started for the run.

Why: issue 21 asks how the job scales with workers. This starts a standalone master and `--workers`
workers of `--cores` cores each from the pyspark install (no Docker, no Spark download), runs
`pipeline traffic` against it, prints the job's wall time and messages/s, and stops the cluster, so
anyone can rerun the measurement on a machine with more cores than the 2 it was first made on.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pyspark

from plexmq.bench.brokers import free_port

ROOT = Path(__file__).resolve().parent.parent
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


@contextmanager
def cluster(workers: int, cores: int, memory: str, logs: Path) -> Iterator[str]:
    """A master and `workers` workers on 127.0.0.1, up until the context ends; yields the master URL."""
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    env = os.environ | {"SPARK_LOG_DIR": str(logs), "SPARK_LOCAL_IP": "127.0.0.1"}
    master_log = logs / "master.log"
    processes = [subprocess.Popen(
        [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(free_port())],
        stdout=master_log.open("w"), stderr=subprocess.STDOUT, env=env)]
    try:
        for i in range(workers):
            processes.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", url, "--cores", str(cores),
                 "--memory", memory, "--webui-port", str(free_port()), "--work-dir", str(logs / f"worker-{i}")],
                stdout=(logs / f"worker-{i}.log").open("w"), stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + 120
        while len(re.findall("Registering worker", master_log.read_text())) < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                raise SystemExit(f"the cluster did not start: see {logs}")
            time.sleep(0.5)
        yield url
    finally:
        for p in reversed(processes):
            p.terminate()
        for p in processes:
            p.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline_cluster", description=__doc__)
    parser.add_argument("--archive", required=True, help="the archive directory to analyse")
    parser.add_argument("--out", required=True, help="the job's output directory")
    parser.add_argument("--workers", type=int, default=2, help="standalone workers (2)")
    parser.add_argument("--cores", type=int, default=1, help="cores per worker, one executor each (1)")
    parser.add_argument("--memory", default="2g", help="memory per worker and its executor (2g)")
    parser.add_argument("--driver-memory", default="512m", help="the driver's heap (512m)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="plexmq-cluster-") as logs, \
            cluster(args.workers, args.cores, args.memory, Path(logs)) as url:
        env = os.environ | {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        start = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "pipeline", "traffic", "--archive", args.archive, "--out", args.out,
             "--master", url, "--driver-memory", args.driver_memory,
             "--conf", f"spark.executor.memory={args.memory}", "--conf", f"spark.executor.cores={args.cores}"],
            check=True, cwd=ROOT, env=env)
        wall = time.monotonic() - start
    messages = sum(f.metadata.num_rows for f in pq.ParquetDataset(f"{args.out}/messages").fragments)
    print(f"{args.workers} workers x {args.cores} cores: {messages:,} messages in {wall:.1f} s, "
          f"{messages / wall:,.0f} messages/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
