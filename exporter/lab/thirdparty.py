"""Engines someone else wrote, for the drills and the demo: llama-server and Triton.

llama.cpp's ``llama-server`` and Triton Inference Server (through PyTriton) are built or
installed from the package registries into a cache that outlives a checkout, and started with
a tiny model.

``llama-server``: its C++ source ships inside the ``llama-cpp-python`` source distribution
(``vendor/llama.cpp``). :func:`build_llama_server` downloads that sdist with pip, builds the
``llama-server`` target alone with CMake (CPU backend, no network features, no web UI
download) and keeps the binary, with the LLaMA SentencePiece vocabulary that llama.cpp ships
for its own tokenizer tests, in ``<cache>/llama-server-<version>/``: a machine builds each
version once. :func:`write_tiny_gguf` writes a Llama-shaped model with random weights
(seeded: the same bytes every time) and that real 32,000-token vocabulary.

Triton: the ``nvidia-pytriton`` wheel carries ``tritonserver`` and a Python backend stub
built against Debian's ``libpython3.11``; :func:`pytriton_python` makes a virtualenv of
Debian's own ``python3`` for it in ``<cache>/pytriton-<version>/`` (the project's virtualenv
may run another build of Python 3.11, and the Triton client pins a protobuf that the image's
gRPC code does not accept). The model it serves is :mod:`exporter.lab.tritonmodel`.

``python -m exporter.lab.thirdparty build`` builds and installs both (``make thirdparty``).
The cache is ``$INFERENCE_LAB_CACHE``, else ``$XDG_CACHE_HOME/inference-bottleneck-exporter``,
else ``~/.cache/inference-bottleneck-exporter``. No torch is imported here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.config import ArgumentParser
from exporter.lab.processes import Child, StackError, free_port, http_get, spawn, wait_until

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
PYTRITON_VERSION = "0.7.0"
VOCAB = "ggml-vocab-llama-spm.gguf"
# Debian's interpreter: the PyTriton stub links its libpython3.11.
SYSTEM_PYTHON = "/usr/bin/python3"

# llama.cpp's CMake options: the server and what it links, for any x86-64 CPU (GGML_NATIVE
# off: the cache may be shared by machines of another CPU generation), no HTTPS or download
# code, the web UI neither built nor fetched.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_OPENMP=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
)


def cache_root() -> Path:
    """Where built engines and their environments live (see the module docstring)."""
    explicit = os.environ.get("INFERENCE_LAB_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inference-bottleneck-exporter"


def llama_dir() -> Path:
    return cache_root() / f"llama-server-{LLAMA_CPP_PYTHON_VERSION}"


def llama_server_binary() -> Path:
    return llama_dir() / "llama-server"


def llama_vocab() -> Path:
    return llama_dir() / VOCAB


def pytriton_dir() -> Path:
    return cache_root() / f"pytriton-{PYTRITON_VERSION}"


def pytriton_python() -> Path:
    return pytriton_dir() / "bin" / "python"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- llama-server --------------------------------------------------------------------------


def build_llama_server(jobs: int = 2) -> Path:
    """The cached ``llama-server`` binary, built first when this version has none. Returns its
    path; raises :class:`StackError` when a step fails (the message names the step's log)."""
    binary = llama_server_binary()
    if binary.exists() and llama_vocab().exists():
        return binary
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llama-build-", dir=root) as tmp:
        work = Path(tmp)
        log = work / "build.log"
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--dest",
                str(work),
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
            ],
            log,
            "download the llama-cpp-python source",
        )
        source = _extract_llama_cpp(next(work.glob("llama_cpp_python-*.tar.gz")), work)
        build = work / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        _run(
            ["cmake", "-S", str(source), "-B", str(build), *generator, *CMAKE_OPTIONS],
            log,
            "configure llama.cpp",
        )
        _run(
            ["cmake", "--build", str(build), "--target", "llama-server", f"-j{jobs}"],
            log,
            "build llama-server",
        )
        staged = work / "out"
        staged.mkdir()
        shutil.copy2(build / "bin" / "llama-server", staged / "llama-server")
        shutil.copy2(source / "models" / VOCAB, staged / VOCAB)
        seconds = time.monotonic() - began
        (staged / "BUILD").write_text(
            f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}\nbuild seconds {seconds:.0f}\n"
            f"jobs {jobs}\n",
            encoding="utf-8",
        )
        shutil.rmtree(llama_dir(), ignore_errors=True)
        staged.rename(llama_dir())  # one rename: a half-built cache is never seen
    _say(f"llama-server {LLAMA_CPP_PYTHON_VERSION} built in {seconds:.0f} s: {binary}")
    return binary


def _run(cmd: Sequence[str], log: Path, what: str) -> None:
    with log.open("ab") as out:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        proc = subprocess.run(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise StackError(f"could not {what} (exit {proc.returncode}):\n{tail}")


def _extract_llama_cpp(sdist: Path, into: Path) -> Path:
    """``vendor/llama.cpp`` of the sdist, without the other vocabularies and test data."""
    keep = re.compile(r"^[^/]+/vendor/llama\.cpp/")
    skip = re.compile(r"^[^/]+/vendor/llama\.cpp/models/(?!ggml-vocab-llama-spm\.gguf$)")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if keep.match(m.name) and not skip.match(m.name)]
        tar.extractall(into, members=members, filter="data")
    found = sorted(into.glob("*/vendor/llama.cpp"))
    if not found:
        raise StackError(f"{sdist.name} holds no vendor/llama.cpp")
    return found[0]


@dataclass(frozen=True)
class TinyLlama:
    """The shape of the drills' model: small enough to decode a token in about a
    millisecond on one core, with the real vocabulary (its output layer dominates)."""

    layers: int = 2
    width: int = 64
    heads: int = 4
    kv_heads: int = 4
    ffn: int = 172
    context: int = 4096
    seed: int = 0


def write_tiny_gguf(path: Path, vocab: Path, shape: TinyLlama = TinyLlama()) -> Path:
    """A Llama-architecture GGUF with seeded random float32 weights and ``vocab``'s tokenizer
    (every ``tokenizer.*`` key copied). The same arguments write the same bytes."""
    import numpy as np  # noqa: PLC0415 - the lab's optional dependencies
    from gguf import GGUFReader, GGUFValueType, GGUFWriter  # noqa: PLC0415

    reader = GGUFReader(vocab)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    n_vocab = len(tokens)
    rng = np.random.default_rng(shape.seed)

    def weight(*dims: int) -> Any:
        # numpy shape (rows, cols) is GGUF's (cols, rows): the input dimension last.
        return (rng.standard_normal(dims) / np.sqrt(dims[-1])).astype(np.float32)

    tmp = path.with_suffix(".tmp")
    writer = GGUFWriter(str(tmp), "llama")
    writer.add_name("inference-lab-tiny-llama")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.width)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.width // shape.heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(0)  # all float32
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        value = field.contents()
        if kind == GGUFValueType.ARRAY:
            writer.add_array(name, value)
        else:
            writer.add_key_value(name, value, kind)
    kv_width = shape.width // shape.heads * shape.kv_heads
    writer.add_tensor("token_embd.weight", weight(n_vocab, shape.width))
    for i in range(shape.layers):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(shape.width, np.float32))
        writer.add_tensor(f"{blk}.attn_q.weight", weight(shape.width, shape.width))
        writer.add_tensor(f"{blk}.attn_k.weight", weight(kv_width, shape.width))
        writer.add_tensor(f"{blk}.attn_v.weight", weight(kv_width, shape.width))
        writer.add_tensor(f"{blk}.attn_output.weight", weight(shape.width, shape.width))
        writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(shape.width, np.float32))
        writer.add_tensor(f"{blk}.ffn_gate.weight", weight(shape.ffn, shape.width))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(shape.ffn, shape.width))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(shape.width, shape.ffn))
    writer.add_tensor("output_norm.weight", np.ones(shape.width, np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, shape.width))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def tiny_model() -> Path:
    """The drills' GGUF in the cache, written once (needs the built llama-server's vocab)."""
    path = llama_dir() / "tiny-llama.gguf"
    if not path.exists():
        write_tiny_gguf(path, llama_vocab())
    return path


@dataclass
class Launched:
    """A started third-party engine: its processes, the URL of its serving API and of its
    Prometheus metrics (Triton serves them on a port of their own)."""

    children: list[Child]
    api_url: str
    metrics_url: str


# The drills' llama-server: 4 slots share the continuous batch (a request beyond them waits:
# llamacpp:requests_deferred); one thread at nice 10: on a CPU its compute stands in for the
# GPU's, which takes no CPU from the host's processes, so busy-loopers in its session take
# nearly all of it (nice matters only within a session under autogroup scheduling; alone in
# its session the engine has its share whatever its nice). Not two threads: ggml's threads
# spin at each step's barrier, and on a busy 2-CPU machine a step then took 120 ms instead of
# 0.7 ms.
LLAMA_PARALLEL = 4
LLAMA_THREADS = 1
LLAMA_NICE = 10
LLAMA_HTTP_THREADS = 256


def start_llama_server(
    workdir: Path,
    args: Sequence[str] = (),
    *,
    port: int = 0,
    exact_port: bool = False,
    injections: Sequence[str] = (),
    timeout: float = 120.0,
) -> Launched:
    """``llama-server --metrics`` on 127.0.0.1 with the tiny model; waits for ``/health``.
    ``args`` come last (a later ``--parallel`` wins). ``port`` is taken when free, else
    another; with ``exact_port`` it is taken as it is (a restart on the port a killed server
    left, whose old connections may still hold it for a plain bind; the server reuses it)."""
    binary = llama_server_binary()
    if not binary.exists():
        raise StackError(f"no llama-server at {binary}: run make thirdparty")
    port = port if exact_port and port else free_port(port)
    cmd = [
        "nice",
        "-n",
        str(LLAMA_NICE),
        str(binary),
        "--model",
        str(tiny_model()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics",
        "--slots",
        "--parallel",
        str(LLAMA_PARALLEL),
        "--threads",
        str(LLAMA_THREADS),
        "--ctx-size",
        str(LLAMA_PARALLEL * 1024),
        # Every open request holds one of its HTTP threads (by default the slots + 2): with a
        # deep queue /metrics waited for one past the sidecar's deadline.
        "--threads-http",
        str(LLAMA_HTTP_THREADS),
        "--no-webui",
        *args,
    ]
    child = spawn("engine", with_helpers(cmd, injections), workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: http_get(url + "/health", 2)[0] == 200, timeout, "/health 200", child=child
        )
    except StackError:
        child.stop()
        raise
    return Launched([child], url, url + "/metrics")


# --- Triton through PyTriton -----------------------------------------------------------------


def install_pytriton() -> Path:
    """Debian's ``python3`` virtualenv with ``nvidia-pytriton`` (made once); its python."""
    python = pytriton_python()
    if python.exists() and (pytriton_dir() / "READY").exists():
        return python
    if not Path(SYSTEM_PYTHON).exists():
        raise StackError(f"PyTriton needs Debian's {SYSTEM_PYTHON} (apt-get install python3)")
    shutil.rmtree(pytriton_dir(), ignore_errors=True)
    pytriton_dir().parent.mkdir(parents=True, exist_ok=True)
    log = cache_root() / "pytriton-install.log"
    log.unlink(missing_ok=True)
    _run([SYSTEM_PYTHON, "-m", "venv", str(pytriton_dir())], log, "make PyTriton's virtualenv")
    _run(
        [str(python), "-m", "pip", "install", "--quiet", f"nvidia-pytriton=={PYTRITON_VERSION}"],
        log,
        "install nvidia-pytriton",
    )
    (pytriton_dir() / "READY").write_text(PYTRITON_VERSION + "\n", encoding="utf-8")
    return python


# The drills' Triton: 4 model instances; a step of 4 products of width 256 and 3 ms of
# device wait, so a 192-token request takes about 0.65 s (one instance admits 1.5 a second).
TRITON_INSTANCES = 4


def start_triton(
    workdir: Path,
    args: Sequence[str] = (),
    *,
    port: int = 0,
    injections: Sequence[str] = (),
    timeout: float = 180.0,
) -> Launched:
    """Triton (PyTriton) serving :mod:`exporter.lab.tritonmodel` on 127.0.0.1; waits until
    the model is ready. ``args`` are the model script's flags (a later one wins)."""
    python = pytriton_python()
    if not python.exists():
        raise StackError(f"no PyTriton environment at {pytriton_dir()}: run make thirdparty")
    # PyTriton hands each model instance its configuration through a Unix socket with a 1 s
    # deadline; on a loaded machine an instance can miss it, and the server exits. A fresh
    # start is the remedy (it was needed 1 time in 6 here).
    for attempt in range(TRITON_STARTS):
        try:
            return _start_triton_once(
                python, workdir, args, port=port, injections=injections, timeout=timeout
            )
        except StackError:
            if attempt == TRITON_STARTS - 1:
                raise
            (workdir / "engine.log").replace(workdir / f"engine-failed-start-{attempt + 1}.log")
    raise AssertionError("unreachable")


TRITON_STARTS = 3


def _start_triton_once(
    python: Path,
    workdir: Path,
    args: Sequence[str],
    *,
    port: int,
    injections: Sequence[str],
    timeout: float,
) -> Launched:
    http, grpc, metrics = free_port(port), free_port(), free_port()
    cmd = [
        str(python),
        "-m",
        "exporter.lab.tritonmodel",
        "--http-port",
        str(http),
        "--grpc-port",
        str(grpc),
        "--metrics-port",
        str(metrics),
        "--instances",
        str(TRITON_INSTANCES),
        *args,
    ]
    # PyTriton keeps its workspace under $HOME unless told: one per drill, in its work dir.
    child = spawn(
        "engine",
        with_helpers(cmd, injections),
        workdir,
        env={"PYTRITON_HOME": str(workdir / "pytriton")},
    )
    url = f"http://127.0.0.1:{http}"
    ready = f"{url}/v2/health/ready" if "--no-model" in args else f"{url}/v2/models/tiny/ready"
    metrics_url = f"http://127.0.0.1:{metrics}/metrics"
    try:
        wait_until(
            lambda: http_get(ready, 2)[0] == 200,
            timeout,
            "model ready",
            child=child,
        )
        # Triton starts its metrics service after the HTTP one: ready for inference is not yet
        # ready to be scraped (a test of the server without a model read it refused once).
        wait_until(
            lambda: http_get(metrics_url, 2)[0] == 200, timeout, "metrics served", child=child
        )
    except StackError:
        child.stop()
        raise
    return Launched([child], url, metrics_url)


#: What each third-party engine does for an injection made through its own configuration:
#: queue-flood is an admission capacity below the offered load, as the reference engine's.
ENGINE_INJECTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "llamacpp": {"queue-flood": ("--parallel", "1")},
    "triton": {"queue-flood": ("--instances", "1")},
}
ENGINES = tuple(ENGINE_INJECTIONS)


def start(
    engine: str,
    workdir: Path,
    args: Sequence[str] = (),
    *,
    injections: Sequence[str] = (),
    port: int = 0,
    exact_port: bool = False,
) -> Launched:
    """Start ``engine`` ("llamacpp" or "triton") with the engine-side ``injections``."""
    own = ENGINE_INJECTIONS.get(engine)
    if own is None:
        raise StackError(f"unknown third-party engine {engine!r} (one of: {', '.join(ENGINES)})")
    extra = [arg for name in injections if name in own for arg in own[name]]
    workdir.mkdir(parents=True, exist_ok=True)
    if engine == "llamacpp":
        return start_llama_server(
            workdir, [*args, *extra], port=port, exact_port=exact_port, injections=injections
        )
    return start_triton(workdir, [*args, *extra], port=port, injections=injections)


# --- injections from outside the engine, in the engine's own session ----------------------------

#: Injections that act on the node, not inside the engine.
OUTSIDE = frozenset({"cpu-contention", "softirq"})


def with_helpers(cmd: Sequence[str], injections: Sequence[str]) -> list[str]:
    """``cmd`` started through :func:`run_with_helpers` when it has ``injections`` from
    outside the engine: the helper processes then share the engine's session. With the
    kernel's autogroup scheduling (on by default) CPU time is shared between sessions first:
    busy-loopers in another session than the engine's would take only their own session's
    share, and a contended node would not contend."""
    outside = sorted(set(injections) & OUTSIDE)
    if not outside:
        return list(cmd)
    flags = [arg for name in outside for arg in ("--inject", name)]
    return [sys.executable, "-m", "exporter.lab.thirdparty", "run", *flags, "--", *cmd]


def run_with_helpers(injections: Sequence[str], cmd: Sequence[str]) -> int:
    """Start the injections' helpers (bounded: they end with this process), then become
    ``cmd``: the same process, so the helpers' parent-death watch follows the engine."""
    from exporter.lab.refengine.inject import Helpers  # noqa: PLC0415

    Helpers.start(frozenset(injections), duration=3600.0)
    os.execvp(cmd[0], list(cmd))
    return 127  # not reached: execvp returns only by raising


# --- command line ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m exporter.lab.thirdparty",
        description="Build llama-server and install PyTriton into the lab's cache.",
    )
    parser.add_argument("command", choices=("build", "where", "run"))
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (2)")
    parser.add_argument(
        "--inject", action="append", default=[], choices=sorted(OUTSIDE), help="run: helpers"
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    # run's engine command line follows "--", whatever flags it has.
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    if args.command == "run":
        cmd = argv[cut + 1 :]
        if not cmd:
            parser.error("run needs the engine's command line after --")
        return run_with_helpers(args.inject, cmd)
    if args.command == "where":
        print(f"llama-server {llama_server_binary()}\npytriton {pytriton_python()}")
        return 0
    try:
        build_llama_server(args.jobs)
        tiny_model()
        install_pytriton()
    except StackError as err:
        _say(f"thirdparty: {err}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
