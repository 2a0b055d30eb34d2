"""`orch doctor`: find what would break a training job before it burns GPU hours.

Two halves, kept apart so the judgement is testable without a GPU or a cluster:
- *gathering* (`gather_local`, `orchestrator.cluster.probes.gather`) reads facts: torch (in a child process, so a
  broken CUDA install is a FAIL line, not a crash, and the CLI itself never imports torch), NVML or
  `nvidia-smi`, /dev/shm, the environment, the cluster's discovery API, nodes and permissions;
- *judging* (`judge_local`, `judge_cluster`) turns plain facts into OK / WARN / FAIL checks, each
  with a one-line fix.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator import naming

OK, WARN, FAIL = "OK", "WARN", "FAIL"

GiB = 1 << 30
MiB = 1 << 20
# NCCL keeps its intra-node buffers in /dev/shm and DataLoader workers pass batches through it;
# Docker's default 64 MiB makes NCCL fail with "unhandled system error" on the first all-reduce.
SHM_FAIL_BELOW = 256 * MiB
SHM_WARN_BELOW = 1 * GiB
MIN_PYTHON = (3, 10)

# NCCL settings that are legitimate while debugging but cost a lot of speed when left on.
SLOW_NCCL_ENV = {
    "NCCL_P2P_DISABLE": "GPU peer-to-peer copies are off (intra-node traffic goes through host memory)",
    "NCCL_IB_DISABLE": "InfiniBand/RoCE is off (inter-node traffic falls back to TCP sockets)",
    "NCCL_SHM_DISABLE": "shared-memory transport is off",
}
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK | WARN | FAIL
    detail: str
    fix: str = ""  # one line; empty for OK

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class GpuFacts:
    """What the driver says, via NVML or nvidia-smi."""

    source: str | None = None  # "nvml" | "nvidia-smi" | None (neither worked)
    names: list[str] = field(default_factory=list)
    memory_bytes: list[int] = field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # the newest CUDA the driver supports, "12.8"
    error: str | None = None


@dataclass
class LocalFacts:
    python_version: str
    torch: dict[str, Any]  # TORCH_PROBE's output; {"error": ...} when torch does not import
    gpus: GpuFacts
    shm_bytes: int | None
    env: dict[str, str]
    c_compiler: str | None = None  # what torch.compile would build its kernels with (Triton, Inductor)


# --- gathering: the only part that touches the machine ----------------------------------------------

# Runs in a child interpreter: the CLI must never import torch, and a CUDA init that hangs or
# crashes must not take `orch doctor` down with it.
TORCH_PROBE = r"""
import json
try:
    import torch
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"})); raise SystemExit
facts = {"version": torch.__version__, "cuda": torch.version.cuda, "cudnn": None, "nccl": None,
         "cuda_available": False, "device_count": 0, "devices": [], "bf16": None}
try:
    facts["cudnn"] = torch.backends.cudnn.version()
except Exception:
    pass
try:
    facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception:
    pass
try:
    facts["cuda_available"] = torch.cuda.is_available()
    if facts["cuda_available"]:
        facts["device_count"] = torch.cuda.device_count()
        facts["devices"] = [torch.cuda.get_device_name(i) for i in range(facts["device_count"])]
        facts["bf16"] = torch.cuda.is_bf16_supported()
except Exception as e:
    facts["cuda_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(facts))
"""


def probe_torch(python: str = sys.executable, timeout: float = 120.0) -> dict[str, Any]:
    try:
        result = subprocess.run([python, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"importing torch took more than {timeout:.0f}s (a hung CUDA driver?)"}
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the torch probe exited {result.returncode}: {last}"}
    probe: dict[str, Any] = json.loads(lines[-1])  # TORCH_PROBE prints one JSON object
    return probe


def probe_nvml(nvml: Any = None) -> GpuFacts:
    """GPU facts from NVML (`nvidia-ml-py`). `nvml` is the pynvml module; tests pass a stand-in."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return GpuFacts(error="nvidia-ml-py is not installed")
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as error:  # NVMLError_LibraryNotFound / DriverNotLoaded on machines without a GPU
        return GpuFacts(error=f"NVML: {error}")
    try:
        facts = GpuFacts(source="nvml", driver_version=_text(nvml.nvmlSystemGetDriverVersion()))
        cuda = nvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12080
        facts.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            facts.names.append(_text(nvml.nvmlDeviceGetName(handle)))
            facts.memory_bytes.append(int(nvml.nvmlDeviceGetMemoryInfo(handle).total))
        return facts
    except Exception as error:
        return GpuFacts(error=f"NVML: {error}")
    finally:
        nvml.nvmlShutdown()


def probe_nvidia_smi() -> GpuFacts:
    """The fallback when NVML cannot be loaded from Python: parse `nvidia-smi --query-gpu`."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return GpuFacts(error="nvidia-smi not found")
    try:
        result = subprocess.run(
            [exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return GpuFacts(error="nvidia-smi did not answer in 30s")
    if result.returncode != 0:
        return GpuFacts(error=f"nvidia-smi: {(result.stdout + result.stderr).strip().splitlines()[-1:]}")
    facts = GpuFacts(source="nvidia-smi")
    for line in result.stdout.strip().splitlines():
        name, memory_mib, driver = (part.strip() for part in line.split(","))
        facts.names.append(name)
        facts.memory_bytes.append(int(float(memory_mib)) * MiB)
        facts.driver_version = driver
    # The driver's CUDA version is only in the banner of plain `nvidia-smi`.
    banner = subprocess.run([exe], capture_output=True, text=True, timeout=30).stdout
    marker = "CUDA Version:"
    if marker in banner:
        facts.cuda_driver_version = banner.split(marker, 1)[1].split()[0]
    return facts


def shm_size(path: str = "/dev/shm") -> int | None:
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize


def find_c_compiler() -> str | None:
    """The compiler Triton would pick ($CC, else gcc, else clang), or cc; None when there is none."""
    for name in (os.environ.get("CC"), "gcc", "clang", "cc"):
        if name and (path := shutil.which(name)):
            return path
    return None


def gather_local(nvml: Any = None) -> LocalFacts:
    gpus = probe_nvml(nvml)
    if gpus.source is None:
        fallback = probe_nvidia_smi()
        gpus = fallback if fallback.source else GpuFacts(error=f"{gpus.error}; {fallback.error}")
    env = {key: value for key, value in os.environ.items() if key.startswith(ENV_PREFIXES)}
    return LocalFacts(platform.python_version(), probe_torch(), gpus, shm_size(), env, find_c_compiler())


def local_checks(*, compiles: bool = False) -> list[Check]:
    """`compiles`: the job at hand sets train.compile (then a C compiler is checked for)."""
    return judge_local(gather_local(), compiles=compiles)


# --- judging: pure functions of the facts -------------------------------------------------------------


def judge_local(facts: LocalFacts, *, compiles: bool = False) -> list[Check]:
    torch = facts.torch
    gpus = facts.gpus
    checks = [_python_check(facts.python_version)]
    if "error" in torch:
        checks.append(
            Check("torch", FAIL, torch["error"], "pip install 'orch-trainer[train]' (or use the orch image)")
        )
        cuda_build = False
    else:
        checks.append(Check("torch", OK, torch["version"]))
        cuda_build = bool(torch.get("cuda"))
        checks.append(_torch_cuda_build_check(torch, gpus))
    checks.append(_gpu_check(gpus, expect_gpu=cuda_build))
    if gpus.source:
        checks.append(_driver_check(gpus, torch.get("cuda")))
    if cuda_build:
        checks += _cuda_runtime_checks(torch, gpus)
    checks.append(_shm_check(facts.shm_bytes))
    checks.append(_nccl_env_check(facts.env))
    if compiles:
        checks.append(_compiler_check(facts.c_compiler))
    return checks


def _compiler_check(compiler: str | None) -> Check:
    """torch.compile builds kernels with a C compiler at the first step (Triton on GPUs, C++ on CPUs);
    `-runtime` CUDA images have none, and the job would fail there, not at start."""
    if compiler:
        return Check("C compiler (train.compile)", OK, compiler)
    return Check(
        "C compiler (train.compile)", FAIL,
        "train.compile: true needs a C compiler (Triton builds its GPU kernels with one); none on PATH "
        "(CC, gcc, clang, cc)",
        "add one to the image (`RUN apt-get update && apt-get install -y --no-install-recommends gcc g++`, "
        "or start FROM a CUDA -devel image), or set train.compile: false",
    )  # fmt: skip


def _python_check(version: str) -> Check:
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) < MIN_PYTHON:
        return Check("python", FAIL, version, f"use Python {'.'.join(map(str, MIN_PYTHON))} or newer")
    return Check("python", OK, version)


def _torch_cuda_build_check(torch: dict[str, Any], gpus: GpuFacts) -> Check:
    if torch.get("cuda"):
        return Check("torch CUDA build", OK, f"built for CUDA {torch['cuda']}")
    if gpus.names:
        return Check(
            "torch CUDA build",
            FAIL,
            f"{torch['version']} is a CPU-only build but GPUs are present",
            "install a CUDA build of torch (pip's default on Linux) or run in the orch CUDA image",
        )
    return Check(
        "torch CUDA build",
        WARN,
        f"{torch['version']} is a CPU-only build",
        "fine for `orch run` on CPU; GPU jobs run in the CUDA image (`orch build`)",
    )


def _gpu_check(gpus: GpuFacts, *, expect_gpu: bool) -> Check:
    if gpus.names:
        summary = ", ".join(
            f"{count} x {name} ({memory / GiB:.0f} GiB)"
            for name, count, memory in _group_gpus(gpus.names, gpus.memory_bytes)
        )
        return Check("GPUs", OK, f"{summary} via {gpus.source}")
    detail = f"no NVIDIA GPU visible ({gpus.error})" if gpus.error else "no NVIDIA GPU visible"
    fix = (
        "check the driver with `nvidia-smi`; in a container run with `--gpus all` / request nvidia.com/gpu; "
        "unset an empty CUDA_VISIBLE_DEVICES"
    )
    # With a CUDA build of torch the user meant to train on GPUs: a missing GPU is an error.
    return Check("GPUs", FAIL if expect_gpu else WARN, detail, fix)


def _group_gpus(names: list[str], memory: list[int]) -> list[tuple[str, int, int]]:
    grouped: dict[str, list[int]] = {}
    for name, size in zip(names, memory or [0] * len(names), strict=False):
        grouped.setdefault(name, []).append(size)
    return [(name, len(sizes), max(sizes)) for name, sizes in grouped.items()]


def _driver_check(gpus: GpuFacts, torch_cuda: str | None) -> Check:
    detail = f"driver {gpus.driver_version}" + (
        f", supports CUDA {gpus.cuda_driver_version}" if gpus.cuda_driver_version else ""
    )
    if not (torch_cuda and gpus.cuda_driver_version):
        return Check("NVIDIA driver", OK, detail)
    need, have = _version(torch_cuda), _version(gpus.cuda_driver_version)
    if need[0] > have[0]:
        return Check(
            "NVIDIA driver",
            FAIL,
            f"{detail}; torch needs CUDA {torch_cuda}",
            f"upgrade the driver to one for CUDA {need[0]}.x, or use a torch/image built for "
            f"CUDA {have[0]}.x (--build-arg BASE_IMAGE=...)",
        )
    if need > have:
        # CUDA minor-version compatibility: a 12.8 runtime runs on a 12.4 driver, minus PTX JIT.
        return Check(
            "NVIDIA driver",
            WARN,
            f"{detail}; torch was built for CUDA {torch_cuda}",
            "works through minor-version compatibility; upgrade the driver if kernels fail to load",
        )
    return Check("NVIDIA driver", OK, detail)


def _cuda_runtime_checks(torch: dict[str, Any], gpus: GpuFacts) -> list[Check]:
    if not torch.get("cuda_available"):
        detail = torch.get("cuda_error") or "torch.cuda.is_available() is False"
        return [
            Check(
                "CUDA available",
                FAIL if gpus.names else WARN,
                detail,
                "the driver must be at least as new as torch's CUDA; check `nvidia-smi` and "
                "CUDA_VISIBLE_DEVICES",
            )
        ]
    checks = [
        Check("CUDA available", OK, f"{torch['device_count']} device(s): {', '.join(torch['devices'])}")
    ]
    cudnn = torch.get("cudnn")
    checks.append(
        Check("cuDNN", OK, _cudnn_text(cudnn))
        if cudnn
        else Check("cuDNN", WARN, "torch finds no cuDNN", "use a torch wheel or image that bundles cuDNN")
    )
    nccl = torch.get("nccl")
    checks.append(
        Check("NCCL", OK, nccl)
        if nccl
        else Check("NCCL", WARN, "torch has no NCCL", "multi-GPU jobs need a torch build with NCCL")
    )
    if torch.get("bf16"):
        checks.append(Check("bf16", OK, "supported"))
    else:
        checks.append(
            Check(
                "bf16",
                WARN,
                "these GPUs have no bf16 (pre-Ampere)",
                "set train.precision: fp16 (or fp32) in job.yaml",
            )
        )
    return checks


def _cudnn_text(version: int) -> str:
    # torch reports 90100 for 9.1.0 (and 8902 for 8.9.2 before cuDNN 9).
    if version >= 10000:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


def _shm_check(size: int | None) -> Check:
    if size is None:
        return Check("/dev/shm", WARN, "not found", "on Linux mount a tmpfs at /dev/shm; elsewhere ignore")
    text = f"{size / GiB:.2f} GiB" if size >= GiB else f"{size / MiB:.0f} MiB"
    fix = (
        "docker run --shm-size=16g / podman run --shm-size=16g; in job.yaml set resources.shm "
        "(orch mounts a memory-backed emptyDir of that size)"
    )
    if size < SHM_FAIL_BELOW:
        return Check("/dev/shm", FAIL, f"{text}: too small for NCCL and DataLoader workers", fix)
    if size < SHM_WARN_BELOW:
        return Check("/dev/shm", WARN, f"{text}: tight for several DataLoader workers", fix)
    return Check("/dev/shm", OK, text)


def _nccl_env_check(env: dict[str, str]) -> Check:
    slow = [
        f"{key}={env[key]} ({why})"
        for key, why in SLOW_NCCL_ENV.items()
        if env.get(key, "0") not in ("", "0")
    ]
    if env.get("CUDA_VISIBLE_DEVICES") == "":
        return Check(
            "NCCL/CUDA env",
            FAIL,
            "CUDA_VISIBLE_DEVICES is set but empty: every GPU is hidden",
            "unset CUDA_VISIBLE_DEVICES",
        )
    if slow:
        return Check("NCCL/CUDA env", WARN, "; ".join(slow), "unset these unless you are debugging NCCL")
    if env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
        return Check(
            "NCCL/CUDA env",
            WARN,
            f"NCCL_DEBUG={env['NCCL_DEBUG']} logs a lot on every rank",
            "use NCCL_DEBUG=WARN outside debugging",
        )
    shown = ", ".join(f"{key}={value}" for key, value in sorted(env.items())) or "nothing set"
    return Check("NCCL/CUDA env", OK, shown)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --- cluster -------------------------------------------------------------------------------------------

MONITORING_GROUP = "monitoring.coreos.com"
MONITORING_NEEDED = ("podmonitors", "prometheusrules")  # what `orch render` emits
GPU_RESOURCE = naming.GPU_RESOURCE


def cluster_checks(
    *, namespace: str | None = None, context: str | None = None, kubeconfig: str | None = None
) -> list[Check]:
    from orchestrator import cluster
    from orchestrator.cluster import probes

    try:
        target = cluster.connect(cluster.Target(kubeconfig=kubeconfig, context=context, namespace=namespace))
        facts = probes.gather(target)
    except cluster.Unauthorized as error:  # it answered: the credentials are the finding
        return [Check("cluster", FAIL, f"answered, but rejected the credentials: {error}",
                      "renew the kubeconfig's token or certificate (is it expired?), or pass --context")]  # fmt: skip
    except Exception as error:  # any failure to talk to the cluster is the finding itself
        return [
            Check(
                "cluster",
                FAIL,
                f"not reachable: {error}",
                "check `kubectl config current-context`, the VPN/API endpoint, or pass --context",
            )
        ]
    return judge_cluster(facts)


def judge_cluster(facts: dict[str, Any]) -> list[Check]:
    """Judge `orchestrator.cluster.probes.gather`'s plain-data answer (see that function for its keys)."""
    from orchestrator.apis import by_key  # a table of constants; kubernetes stays unimported
    from orchestrator.kube.kinds import KUEUE_GROUP

    refused = facts.get("refused") or {}
    version = facts.get("version") or (
        f"unknown: /version {_refusal(refused['version'])}" if "version" in refused else "unknown"
    )
    checks = [Check("cluster", OK, f"{facts['server']} (Kubernetes {version})")]
    if "discovery" in refused:
        checks.append(
            Check(
                "job APIs",
                WARN,
                f"cannot tell which the cluster serves: the cluster answered, but API discovery (/apis) "
                f"{_refusal(refused['discovery'])}",
                "ask an admin for the system:discovery ClusterRole (every authenticated user has it by default)",
            )
        )
        checks.append(_gpu_nodes_check(facts.get("nodes"), refused.get("nodes")))
        return checks
    apis = facts.get("apis") or {}
    served = {key for key, api in apis.items() if api.get("versions")}
    checks += [_api_check(key, api, served) for key, api in apis.items()]
    for key in (
        k for k in apis if k in served
    ):  # what each served API needs besides its kind: its module judges
        checks += [Check(*line) for line in by_key(key).setup_checks(apis[key].get("setup") or {})]
    kueue = facts.get("kueue_versions") or []
    checks.append(
        Check("Kueue", OK, f"{KUEUE_GROUP} {', '.join(kueue)}")
        if kueue
        else Check("Kueue", OK, "not installed (only `scheduling.queue` needs it)")
    )
    monitoring = set(facts.get("monitoring_resources") or [])
    missing = [name for name in MONITORING_NEEDED if name not in monitoring]
    if missing:
        checks.append(
            Check(
                "Prometheus Operator CRDs",
                WARN,
                f"missing {', '.join(missing)}.{MONITORING_GROUP}",
                "install kube-prometheus-stack, or set metrics.enabled: false in job.yaml",
            )
        )
    else:
        checks.append(Check("Prometheus Operator CRDs", OK, ", ".join(sorted(monitoring))))
    checks.append(_gpu_nodes_check(facts.get("nodes"), refused.get("nodes")))
    checks += [_access_check(facts, key, apis[key]["kind"]) for key in apis if key in served]
    return checks


def _api_check(key: str, api: dict[str, Any], served: set[str]) -> Check:
    """One job API: served (with its versions), or not; missing is a failure only when neither API is served."""
    from orchestrator.apis import by_key  # a table of constants; kubernetes stays unimported

    job_api = by_key(key)
    name = f"{api['kind']} CRD"
    if api.get("versions"):
        return Check(name, OK, f"{api['group']} {', '.join(api['versions'])} ({job_api.operator})")
    detail = f"{job_api.resource} is not installed"
    if served:
        others = " and ".join(sorted(served))
        return Check(name, OK, f"{detail}; `api: auto` submits to {others}")
    return Check(name, FAIL, detail, f"install the {job_api.operator}: {job_api.install}")


def _refusal(refused: dict[str, Any]) -> str:
    """How a refused read is said: `was refused (RBAC): <the server's words>` or `is not served: ...`."""
    how = "was refused (RBAC)" if refused.get("status") == 403 else "is not served"
    return f"{how}: {refused.get('said') or refused.get('error')}"


def _gpu_nodes_check(nodes: list[dict[str, Any]] | None, refused: dict[str, Any] | None) -> Check:
    if nodes is None:
        forbidden = (refused or {}).get("status") == 403
        return Check(
            "GPU nodes",
            WARN,
            f"cannot tell: the cluster answered, but listing nodes {_refusal(refused or {})}",
            "nodes are cluster-scoped: ask an admin for a ClusterRole with `list` on nodes (manifests/rbac.yaml's "
            "Role is namespaced and cannot grant it), or trust that GPU nodes exist"
            if forbidden
            else "trust that GPU nodes exist, or ask the cluster's admin how GPU nodes are offered",
        )
    gpu_nodes = [node for node in nodes if int(node.get("gpus") or 0) > 0]
    if not gpu_nodes:
        return Check(
            "GPU nodes",
            FAIL,
            f"none of {len(nodes)} node(s) has {GPU_RESOURCE} allocatable",
            "install the NVIDIA device plugin / GPU Operator, or add GPU nodes",
        )
    products: dict[str, int] = {}
    for node in gpu_nodes:
        product = node.get("product") or "unknown product"
        products[product] = products.get(product, 0) + int(node["gpus"])
    summary = ", ".join(f"{count} x {product}" for product, count in sorted(products.items()))
    return Check("GPU nodes", OK, f"{len(gpu_nodes)} node(s): {summary}")


def _access_check(facts: dict[str, Any], key: str, kind: str) -> Check:
    namespace = facts.get("namespace") or "default"
    access = (facts.get("access") or {}).get(key) or {}
    plural = f"{kind.lower()}s"
    if "allowed" not in access:
        return Check(
            f"permissions ({kind})",
            WARN,
            f"could not ask the API server ({access.get('error')})",
            f"try `kubectl auth can-i create {plural} -n {namespace}`",
        )
    if not access["allowed"]:
        return Check(
            f"permissions ({kind})",
            FAIL,
            f"you may not create {plural} in namespace {namespace} ({access.get('reason') or 'denied'})",
            "ask an admin to bind manifests/rbac.yaml's Role to you, or pick another -n",
        )
    return Check(f"permissions ({kind})", OK, f"may create {plural} in namespace {namespace}")
