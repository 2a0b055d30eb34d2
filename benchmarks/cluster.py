"""Section 10: what each cluster command costs as the job grows, side by side with kubectl.

One emulated API server (tests/fakes/, real HTTP) serves a job of N pods, for N in 8, 64, 512, 1,024, on both
APIs (PyTorchJob: a master and N-1 workers; TrainJob: N JobSet pods), and a namespace of 200 jobs. Each orch
command and kubectl's nearest equivalent run as fresh processes against the same server, through a counting
proxy: wall time, API requests, bytes read (server to client, headers included) and the peak memory of the
process (ru_maxrss from wait4). Ratios are orch / kubectl in the same run; absolute times are context only.

Also: the requests and bytes of `orch wait` over a fixed window on a running job (they must not grow with N:
watches, not polls), and `orch render` / `orch submit` at 1,024 nodes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, BenchError, base_env, scratch_dir, table

SIZES = (8, 64, 512, 1024)
QUICK_SIZES = (8, 64)
LIST_JOBS = 200
WAIT_WINDOW = 6.0  # seconds `orch wait` watches a running job for the requests-per-window figure
APIS = ("pytorchjob", "trainjob")


@dataclass
class Cost:
    wall: float
    cpu: float  # user + system seconds of the process: what it costs whatever else the machine does
    requests: int
    bytes_read: int
    peak_mib: float


class CountingProxy:
    """127.0.0.1 TCP proxy in front of the emulator: counts the bytes the server sends back."""

    def __init__(self, target_port: int) -> None:
        self.target_port, self.bytes_read = target_port, 0
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, count: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if count:
                    with self.lock:
                        self.bytes_read += len(chunk)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()


class Bench:
    def __init__(self, kube: Any, work: Path) -> None:
        from tests.fakes.cli import write_kubeconfig

        self.kube = kube
        self.proxy = CountingProxy(int(kube.url.rsplit(":", 1)[1]))
        url = f"http://127.0.0.1:{self.proxy.port}"
        self.kubeconfig = write_kubeconfig(
            work / "kubeconfig", url, contexts={"bench": "default"}, current="bench"
        )
        home = work / "home"
        home.mkdir()
        self.env = base_env(KUBECONFIG=str(self.kubeconfig), HOME=str(home))
        self.work = work

    def run(self, cmd: list[str], *, ok: tuple[int, ...] = (0,)) -> Cost:
        """One fresh process, measured. Its peak memory comes from GNU time: a child forked from this (large)
        process would report this process's memory as its own high-water mark."""
        requests, read = len(self.kube.requests()), self.proxy.bytes_read
        peak_file = self.work / "peak"
        started = time.perf_counter()
        proc = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", str(peak_file), *cmd], env=self.env,
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        code = os.waitstatus_to_exitcode(status)
        error = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if code not in ok:
            raise BenchError(f"{' '.join(cmd)} failed (exit {code}): {error.strip()[-500:]}")
        time.sleep(0.05)  # the proxy's last chunks
        peak_kib = int(peak_file.read_text().split()[-1])
        return Cost(wall, usage.ru_utime + usage.ru_stime, len(self.kube.requests()) - requests,
                    self.proxy.bytes_read - read, peak_kib / 1024)  # fmt: skip

    def orch(self, *args: str, ok: tuple[int, ...] = (0,)) -> Cost:
        return self.run([sys.executable, "-m", "orchestrator", *args], ok=ok)

    def kubectl(self, *args: str, ok: tuple[int, ...] = (0,)) -> Cost:
        return self.run(["kubectl", *args], ok=ok)


def _median(costs: list[Cost]) -> Cost:
    return Cost(
        statistics.median(c.wall for c in costs),
        statistics.median(c.cpu for c in costs),
        int(statistics.median(c.requests for c in costs)),
        int(statistics.median(c.bytes_read for c in costs)),
        statistics.median(c.peak_mib for c in costs),
    )


def _job_file(work: Path, file: str, nodes: int, api: str, name: str = "big") -> Path:
    path = work / f"{file}.yaml"
    path.write_text(
        f"name: {name}\nimage: registry.example/trainer:1\napi: {api}\nnodes: {nodes}\ngpus_per_node: 8\n"
        "restart:\n  policy: on-failure\ntrain:\n  task: digits\n  batch_size: 65536\n  max_steps: 10\n"
    )
    return path


def _seed_pods(kube: Any, namespace: str, name: str, api: str) -> tuple[list[str], str]:
    """The controller's part: the job's pods, running, each with a few log lines; returns (pods, selector)."""
    from tests.fakes.trainer import TrainerV2

    if api == "trainjob":
        pods = TrainerV2(kube, namespace, name).start()
        selector = f"jobset.sigs.k8s.io/jobset-name={name}"
    else:
        job = kube.get("kubeflow.org/v1/pytorchjobs", namespace, name)
        workers = int(job["spec"]["pytorchReplicaSpecs"].get("Worker", {}).get("replicas", 0))
        kube.set_conditions(namespace, name, ("Created", "True"), ("Running", "True"))
        pods = [kube.add_pod(namespace, name, "master", 0)]
        pods += [kube.add_pod(namespace, name, "worker", i, node=f"node-{i + 1}") for i in range(workers)]
        selector = f"training.kubeflow.org/job-name={name}"
    for pod in pods:
        kube.write_log(namespace, pod, f"{pod} step 1 loss 2.30", f"{pod} step 2 loss 2.10")
    return pods, selector


def _finish(kube: Any, namespace: str, name: str, api: str) -> None:
    if api == "trainjob":
        from tests.fakes.trainer import TrainerV2

        TrainerV2(kube, namespace, name).set_condition("Complete", "AllJobsCompleted", "jobset completed")
    else:
        kube.set_conditions(namespace, name, ("Running", "False"), ("Succeeded", "True"))


def _kind(api: str) -> str:
    return "trainjobs.trainer.kubeflow.org" if api == "trainjob" else "pytorchjobs.kubeflow.org"


def measure(*, sizes: tuple[int, ...] = SIZES, rounds: int = 3) -> dict[str, Any]:
    from tests.fakes.emulator import serve

    results: dict[str, Any] = {"sizes": list(sizes), "rounds": rounds, "rows": [], "wait_window": []}
    work = scratch_dir("orch-bench-cluster-")
    # orch's bytecode, as an installed package has it (pip compiles at install): where the environment sets
    # PYTHONDONTWRITEBYTECODE, a module edited since its last .pyc would otherwise be compiled on every run.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "orchestrator")], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    with serve(operator=True, trainer=True) as kube:
        bench = Bench(kube, work)
        bench.kubectl(
            "version", "--request-timeout=5s", ok=(0, 1)
        )  # kubectl's discovery cache, as a user has it
        # Floors: what the lean transport's commands import at least (the interpreter, click, urllib3, yaml),
        # and what importing the official client adds (submit's path, and every kubeconfig it falls back for).
        for code in ("import click, urllib3, ssl, json, yaml", "import kubernetes.client"):
            floor = [bench.run([sys.executable, "-c", code]) for _ in range(rounds)]
            results["rows"].append({"api": "-", "pods": 0, "command": f"python -c '{code}'",
                                    "orch": asdict(_median(floor)), "kubectl": None, "equivalent": ""})  # fmt: skip
        for api in APIS:
            for size in sizes:
                results["rows"] += _one_size(bench, api, size, rounds, results["wait_window"])
        results["rows"] += _many_jobs(bench, rounds)
        results["render"] = _render(bench, rounds)
        bench.proxy.close()
    _print(results)
    return results


def _one_size(
    bench: Bench, api: str, size: int, rounds: int, window: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    kube, namespace, name = bench.kube, f"{api}-{size}", "big"
    rounds = rounds if size <= 64 else 1  # a big job's commands take long: one round each
    job = _job_file(bench.work, f"{api}-{size}", size, api)
    rows: list[dict[str, Any]] = []

    def row(command: str, orch: list[Cost], kubectl: list[Cost] | None, equivalent: str) -> None:
        entry = {"api": api, "pods": size, "command": command, "orch": asdict(_median(orch)), "kubectl": None,
                 "equivalent": equivalent}  # fmt: skip
        if kubectl:
            entry["kubectl"] = asdict(_median(kubectl))
        rows.append(entry)
        print(f"  {api} {size} pods: {command} done", flush=True)

    submit = bench.orch("submit", str(job), "-n", namespace)
    row("submit", [submit], None, "")
    pods, selector = _seed_pods(kube, namespace, name, api)
    kind = _kind(api)
    row("status", [bench.orch("status", name, "-n", namespace) for _ in range(rounds)],
        [bench.kubectl("get", "pods", "-n", namespace, "-l", selector) for _ in range(rounds)],
        f"kubectl get pods -l {selector}")  # fmt: skip
    row("logs --all --tail 1", [bench.orch("logs", name, "-n", namespace, "--all", "--tail", "1") for _ in range(rounds)],
        [bench.kubectl("logs", "-n", namespace, "-l", selector, "--tail", "1", "--prefix", "--max-log-requests", "10")
         for _ in range(rounds)],
        "kubectl logs -l ... --tail 1 --prefix --max-log-requests 10")  # fmt: skip
    row(
        "logs (default selection)",
        [bench.orch("logs", name, "-n", namespace) for _ in range(rounds)],
        None,
        "",
    )
    # Requests while waiting on a running job for a fixed window: constant in the job's size.
    wait_window = bench.orch("wait", name, "-n", namespace, "--timeout", f"{WAIT_WINDOW:g}s", ok=(124,))
    kubectl_window = bench.kubectl(
        "wait",
        "-n",
        namespace,
        f"{kind}/{name}",
        "--for=condition=Succeeded",
        f"--timeout={WAIT_WINDOW:g}s",
        ok=(1,),
    )
    window.append({"api": api, "pods": size, "orch": asdict(wait_window), "kubectl": asdict(kubectl_window)})
    _finish(kube, namespace, name, api)
    condition = "Complete" if api == "trainjob" else "Succeeded"
    row("wait (finished job)", [bench.orch("wait", name, "-n", namespace) for _ in range(rounds)],
        [bench.kubectl("wait", "-n", namespace, f"{kind}/{name}", f"--for=condition={condition}", "--timeout=30s")
         for _ in range(rounds)],
        f"kubectl wait --for=condition={condition}")  # fmt: skip
    # delete: kubectl deletes a copy of the job (the same object under another name)
    copy = kube.get(f"{'trainer.kubeflow.org/v1alpha1/trainjobs' if api == 'trainjob' else 'kubeflow.org/v1/pytorchjobs'}",
                    namespace, name)  # fmt: skip
    resource = (
        "trainer.kubeflow.org/v1alpha1/trainjobs" if api == "trainjob" else "kubeflow.org/v1/pytorchjobs"
    )
    copy = dict(copy, metadata={"name": f"{name}-copy", "labels": copy["metadata"].get("labels", {})})
    kube.put(resource, namespace, copy)
    row("delete", [bench.orch("delete", name, "-n", namespace)],
        [bench.kubectl("delete", "-n", namespace, f"{kind}/{name}-copy")], "kubectl delete")  # fmt: skip
    for pod in pods:  # the garbage collector removed what the job owned; the benchmark's own pods go too
        if kube.get("v1/pods", namespace, pod) is not None:
            kube.delete("v1/pods", namespace, pod)
    return rows


def _many_jobs(bench: Bench, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for api in APIS:
        namespace = f"many-{api}"
        job = _job_file(bench.work, f"many-{api}", 2, api, name="j-000")
        bench.orch("submit", str(job), "-n", namespace)
        resource = (
            "trainer.kubeflow.org/v1alpha1/trainjobs" if api == "trainjob" else "kubeflow.org/v1/pytorchjobs"
        )
        template = bench.kube.get(resource, namespace, "j-000")
        for i in range(1, LIST_JOBS):
            meta = dict(template["metadata"], name=f"j-{i:03d}")
            for key in ("uid", "resourceVersion", "creationTimestamp"):
                meta.pop(key, None)
            bench.kube.put(resource, namespace, dict(template, metadata=meta))
        orch = [bench.orch("list", "-n", namespace) for _ in range(rounds)]
        kubectl = [bench.kubectl("get", _kind(api), "-n", namespace, "-l", "app.kubernetes.io/managed-by=orch")
                   for _ in range(rounds)]  # fmt: skip
        rows.append({"api": api, "pods": 0, "command": f"list ({LIST_JOBS} jobs)", "orch": asdict(_median(orch)),
                     "kubectl": asdict(_median(kubectl)), "equivalent": "kubectl get KIND -l managed-by=orch"})  # fmt: skip
        print(f"  {api}: list of {LIST_JOBS} jobs done", flush=True)
    return rows


def _render(bench: Bench, rounds: int) -> list[dict[str, Any]]:
    out = []
    for api in APIS:
        for nodes in (8, 1024):
            job = _job_file(bench.work, f"render-{api}-{nodes}", nodes, api)
            costs = [bench.orch("render", str(job)) for _ in range(rounds)]
            out.append({"api": api, "nodes": nodes, "render": asdict(_median(costs))})
    return out


def _print(results: dict[str, Any]) -> None:
    print("\n10. Cluster commands vs kubectl on one emulated API server (median of "
          f"{results['rounds']}; ratio = orch / kubectl wall time)")  # fmt: skip
    rows = []
    for r in results["rows"]:
        o, k = r["orch"], r["kubectl"]
        rows.append((
            r["api"], r["pods"] or "-", r["command"], f"{o['wall']:.2f}s", f"{o['cpu']:.2f}s", o["requests"],
            _kb(o["bytes_read"]), f"{o['peak_mib']:.0f}",
            f"{k['wall']:.2f}s" if k else "-", f"{k['cpu']:.2f}s" if k else "-", k["requests"] if k else "-",
            _kb(k["bytes_read"]) if k else "-", f"{k['peak_mib']:.0f}" if k else "-",
            f"{o['wall'] / k['wall']:.2f}x" if k else "-", f"{o['cpu'] / max(k['cpu'], 1e-3):.2f}x" if k else "-",
        ))  # fmt: skip
    print(table(("api", "pods", "command", "orch wall", "cpu", "req", "read", "MiB", "kubectl wall", "cpu", "req",
                 "read", "MiB", "wall ratio", "cpu ratio"), rows))  # fmt: skip
    print(
        f"\n   requests and bytes while waiting {WAIT_WINDOW:g} s on a running job (orch wait / kubectl wait)"
    )
    print(table(("api", "pods", "orch req", "orch read", "kubectl req", "kubectl read"), [
        (w["api"], w["pods"], w["orch"]["requests"], _kb(w["orch"]["bytes_read"]), w["kubectl"]["requests"],
         _kb(w["kubectl"]["bytes_read"])) for w in results["wait_window"]]))  # fmt: skip
    print("\n   orch render (wall, peak memory)")
    print(table(("api", "nodes", "wall", "MiB"), [
        (r["api"], r["nodes"], f"{r['render']['wall']:.2f}s", f"{r['render']['peak_mib']:.0f}")
        for r in results["render"]]))  # fmt: skip


def _kb(value: int) -> str:
    return f"{value / 1024:.0f} KiB" if value < 10 * 2**20 else f"{value / 2**20:.1f} MiB"
