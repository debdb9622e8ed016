"""Record a torch.profiler (Kineto) trace of one prefill and N decode steps.

The collector builds a decoder-only model with Hugging Face ``transformers`` (random
weights from a preset config, or a local checkpoint), runs a warm-up outside the
profiler, then records exactly one prefill forward over a random prompt and
``decode_steps`` greedy decode steps that reuse the KV cache. Every step is wrapped in a
``torch.profiler.record_function`` range (and, on CUDA, an NVTX range of the same name)
whose name follows the marker grammar the analyzer parses:

* prefill: ``diagnose:prefill[bs={B} toks={B*S}]``
* decode:  ``diagnose:decode[bs={B} ctx={S+i}]`` for decode step ``i`` (0-based), where
  ``ctx`` is the number of tokens already in the KV cache before the step.

In the exported Chrome-trace JSON these ranges are events with ``cat ==
"user_annotation"``. The run's description is attached with
``prof.add_metadata_json("diagnose", ...)`` and appears as a top-level JSON *object*
under the key ``"diagnose"`` (Kineto inlines the JSON text; it is not a string). It must
be added while the profiler is still running: metadata added after the profiler stops is
silently dropped from the export.

torch and transformers are imported lazily, so importing this module is cheap; calling
:func:`collect_torch` needs the ``collect`` extra (``pip install '.[collect]'`` in the project's checkout).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import json
import os
import platform
import re
import shutil
import tempfile
import time
from typing import Any, Iterator

from diagnose.errors import DiagnoseError

COLLECTOR_ID = "diagnose.collectors.torch_collector"
"""Value of ``metadata["collector"]`` in traces written by this module."""

METADATA_KEY = "diagnose"
"""Top-level key of the run metadata object in the exported trace JSON."""

PREFILL_MARKER = "diagnose:prefill[bs={bs} toks={toks}]"
"""Format of the prefill step marker; ``toks`` is batch * prompt_len."""

DECODE_MARKER = "diagnose:decode[bs={bs} ctx={ctx}]"
"""Format of the decode step marker; ``ctx`` is the KV-cache length before the step."""

DTYPE_NAMES = ("fp32", "bf16", "fp16")
"""Accepted ``dtype`` names, mapped to torch.float32 / bfloat16 / float16."""

DEVICES = ("cpu", "cuda")
"""Accepted ``device`` names."""

WARMUP_DECODE_STEPS = 2
"""Decode steps run after each warm-up prefill (eager mode)."""

GRAPH_WARMUP_DECODE_STEPS = 3
"""Decode steps per warm-up round with ``cuda_graph``: torch.compile's CUDA-graph trees
compile and warm up on the 1st call, record on the 2nd and replay from the 3rd on."""

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def prefill_marker(batch: int, prompt_len: int) -> str:
    """Return the record_function name for the prefill step.

    Args:
        batch: Batch size B (sequences).
        prompt_len: Prompt length S (tokens per sequence).

    Returns:
        ``"diagnose:prefill[bs={B} toks={B*S}]"``.
    """
    return PREFILL_MARKER.format(bs=batch, toks=batch * prompt_len)


def decode_marker(batch: int, ctx: int) -> str:
    """Return the record_function name for one decode step.

    Args:
        batch: Batch size B (sequences).
        ctx: Tokens per sequence already in the KV cache before this step (S + i for
            decode step i, 0-based).

    Returns:
        ``"diagnose:decode[bs={B} ctx={ctx}]"``.
    """
    return DECODE_MARKER.format(bs=batch, ctx=ctx)


def validate_model_args(config: dict | None, model_path: str | None, device: str, dtype: str) -> None:
    """Checks shared by every collector: one model source, a known device and dtype.

    Raises:
        DiagnoseError: one-line message.
    """
    if (config is None) == (model_path is None):
        raise DiagnoseError("give exactly one of --config or --model")
    if config is not None and not isinstance(config, dict):
        raise DiagnoseError("config must be a dict of Hugging Face config fields")
    if device not in DEVICES:
        raise DiagnoseError(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}")
    if dtype not in DTYPE_NAMES:
        raise DiagnoseError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPE_NAMES)}")


def validate_args(
    config: dict | None,
    model_path: str | None,
    device: str,
    dtype: str,
    batch: int,
    prompt_len: int,
    decode_steps: int,
    cuda_graph: bool = False,
    warmup: int = 1,
) -> None:
    """Check collector arguments without touching torch or the model.

    Args:
        config: Hugging Face config dict (e.g. from :mod:`diagnose.collectors.presets`),
            or None when ``model_path`` is given.
        model_path: Local checkpoint directory or hub id, or None when ``config`` is
            given.
        device: ``"cpu"`` or ``"cuda"``.
        dtype: One of :data:`DTYPE_NAMES`.
        batch: Batch size B, >= 1.
        prompt_len: Prompt length S in tokens, >= 1.
        decode_steps: Number of decode steps N to record, >= 0.
        cuda_graph: Whether decode runs under CUDA graphs; needs ``device == "cuda"``.
        warmup: Warm-up rounds K, >= 0.

    Raises:
        DiagnoseError: Any argument is out of range or inconsistent (one-line message).
    """
    validate_model_args(config, model_path, device, dtype)
    for name, value, low in (
        ("batch", batch, 1),
        ("prompt-len", prompt_len, 1),
        ("decode-steps", decode_steps, 0),
        ("warmup", warmup, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise DiagnoseError(f"--{name} must be an integer >= {low}, got {value!r}")
    if cuda_graph and device != "cuda":
        raise DiagnoseError("--cuda-graph needs --device cuda")


def collect_torch(
    config: dict | None,
    model_path: str | None,
    device: str,
    dtype: str,
    batch: int,
    prompt_len: int,
    decode_steps: int,
    out: str,
    cuda_graph: bool = False,
    warmup: int = 1,
    seed: int = 0,
) -> dict:
    """Profile one prefill and ``decode_steps`` decode steps and write a Kineto trace.

    The model runs in eval mode under ``torch.inference_mode`` (``torch.no_grad`` with
    ``cuda_graph``, the mode transformers' compiled generation uses). The prompt is
    ``[batch, prompt_len]`` random token ids (seeded); each decode step feeds the greedy
    (argmax) token ``[batch, 1]`` with the KV cache. Before recording, ``warmup`` rounds
    of prefill + 2 decode steps (3 with ``cuda_graph``, at least one round) run outside
    the profiler, each on a fresh cache.

    With ``cuda_graph`` the KV cache is a transformers ``StaticCache`` and the decode
    forward is ``torch.compile(mode="reduce-overhead")``, i.e. replayed from CUDA graphs
    (torch.compile's CUDA-graph trees); prefill stays eager.

    Args:
        config: Hugging Face config dict (``model_type`` plus config fields, see
            :mod:`diagnose.collectors.presets`); random weights from ``seed``.
        model_path: Checkpoint directory (loaded with ``local_files_only=True``) or a
            hub id ``org/name`` (may download). Exactly one of config/model_path.
        device: ``"cpu"`` or ``"cuda"``.
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"``: the weights' and activations' dtype.
        batch: Batch size B (sequences), >= 1.
        prompt_len: Prompt length S (tokens per sequence), >= 1.
        decode_steps: Decode steps N to record, >= 0.
        out: Output path; gzip-compressed when it ends with ``.gz``. Written atomically
            (temporary file in the same directory, then ``os.replace``); parent
            directories are created.
        cuda_graph: Run decode steps from CUDA graphs (CUDA only).
        warmup: Warm-up rounds K outside the profiler, >= 0.
        seed: Seed for ``torch.manual_seed`` (weights and prompt).

    Returns:
        A summary dict: ``path`` (str), ``bytes`` (int, size written), ``steps``
        (``{"prefill": 1, "decode": N}``), ``markers`` (the N + 1 marker names in
        order), ``step_wall_ms`` (host wall time of each recorded step, ms; on CUDA it
        includes the synchronize at the step's end), ``metadata`` (the object stored
        under ``"diagnose"`` in the trace).

    Raises:
        DiagnoseError: Bad arguments, CUDA requested but unavailable, or the model
            cannot be loaded.
    """
    validate_args(config, model_path, device, dtype, batch, prompt_len, decode_steps, cuda_graph, warmup)

    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise DiagnoseError("--device cuda requested but torch.cuda.is_available() is False")
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    is_cuda = device == "cuda"

    torch.manual_seed(seed)
    model = _build_model(config, model_path, device, torch_dtype)
    vocab_size = int(model.config.vocab_size)
    cache_kw = _cache_kwarg(model)

    gen = torch.Generator(device="cpu").manual_seed(seed)
    prompt = torch.randint(0, vocab_size, (batch, prompt_len), generator=gen).to(device)

    decode_fn = model
    static_cache = None
    warmup_decode = WARMUP_DECODE_STEPS
    if cuda_graph:
        warmup = max(warmup, 1)
        warmup_decode = GRAPH_WARMUP_DECODE_STEPS
        static_cache = _make_static_cache(model, batch, prompt_len + max(decode_steps, warmup_decode), device, torch_dtype)
        decode_fn = torch.compile(model.forward, mode="reduce-overhead")

    def new_cache():
        if static_cache is None:
            return None  # the model creates a DynamicCache on the prefill forward
        static_cache.reset()  # zeroes in place: CUDA graphs keep pointing at the same buffers
        return static_cache

    def prefill(cache):
        return _forward(model, prompt, cache, cache_kw)

    def decode(ids, cache):
        if cuda_graph:
            torch.compiler.cudagraph_mark_step_begin()
        return _forward(decode_fn, ids, cache, cache_kw)

    # HF's compiled generate path runs under no_grad; keep to it for CUDA graphs.
    grad_ctx = torch.no_grad() if cuda_graph else torch.inference_mode()
    with grad_ctx:
        # Warm-up, outside the profiler.
        for _ in range(warmup):
            ids, cache = prefill(new_cache())
            for _ in range(warmup_decode):
                ids, cache = decode(ids, cache)
        if is_cuda:
            torch.cuda.synchronize()

        meta = _metadata(
            model, device, dtype, batch, prompt_len, decode_steps, cuda_graph, warmup, seed
        )
        prof, markers, wall_ms = _profile_steps(lambda: prefill(new_cache()), decode, batch, prompt_len, decode_steps,
                                                is_cuda, meta)

    size = _export(prof, out)
    return {
        "path": out,
        "bytes": size,
        "steps": {"prefill": 1, "decode": decode_steps},
        "markers": markers,
        "step_wall_ms": wall_ms,
        "metadata": meta,
    }


def _profile_steps(prefill, decode, batch: int, prompt_len: int, decode_steps: int, is_cuda: bool,
                   meta: dict) -> tuple[Any, list[str], list[float]]:
    """One prefill and ``decode_steps`` decode steps under torch.profiler, each inside its step
    marker (:func:`prefill_marker`, :func:`decode_marker`), with ``meta`` stored in the trace:
    (the profiler, the marker names, each step's host wall ms)."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if is_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    markers: list[str] = []
    wall_ms: list[float] = []
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        name = prefill_marker(batch, prompt_len)
        with _step(name, is_cuda, wall_ms):
            ids, cache = prefill()
        markers.append(name)
        for i in range(decode_steps):
            name = decode_marker(batch, prompt_len + i)
            with _step(name, is_cuda, wall_ms):
                ids, cache = decode(ids, cache)
            markers.append(name)
        # Must happen while the profiler is active: added after stop, it is dropped.
        prof.add_metadata_json(METADATA_KEY, json.dumps(meta, default=str))
    return prof, markers, wall_ms


@contextlib.contextmanager
def _step(name: str, is_cuda: bool, wall_ms: list[float]) -> Iterator[None]:
    """Wrap one step in a record_function (+ NVTX on CUDA) range; sync GPU at the end."""
    import torch

    t0 = time.perf_counter()
    with torch.profiler.record_function(name):
        if is_cuda:
            torch.cuda.nvtx.range_push(name)
        try:
            yield
            if is_cuda:
                torch.cuda.synchronize()  # attribute the step's GPU work to its range
        finally:
            if is_cuda:
                torch.cuda.nvtx.range_pop()
    wall_ms.append((time.perf_counter() - t0) * 1e3)


def _forward(fn: Any, ids: Any, cache: Any, cache_kw: str) -> tuple[Any, Any]:
    """Run one forward and return (argmax next ids [B, 1], KV cache after the step)."""
    kwargs = {"input_ids": ids, "use_cache": True}
    if cache is not None:
        kwargs[cache_kw] = cache
    out = fn(**kwargs)
    next_ids = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
    new_cache = getattr(out, "cache", None)
    if new_cache is None:
        new_cache = getattr(out, "past_key_values", None)
    if new_cache is None:
        new_cache = cache
    return next_ids, new_cache


def _cache_kwarg(model: Any) -> str:
    """Name of the forward's KV-cache argument: ``cache`` (transformers >= 5.2x) or
    ``past_key_values`` (older releases)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _build_model(config: dict | None, model_path: str | None, device: str, torch_dtype: Any) -> Any:
    """Build (random weights) or load the causal-LM, in eval mode on ``device``."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    if config is not None:
        fields = dict(config)
        model_type = fields.pop("model_type", "llama")
        try:
            hf_config = AutoConfig.for_model(model_type, **fields)
        except (ValueError, KeyError, TypeError) as exc:
            raise DiagnoseError(f"invalid model config: {_one_line(exc)}") from None
        # Allocate and initialise directly on the device (7B-like weights: 13.4 GB in bf16).
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(hf_config, **{dtype_kw: torch_dtype})
    else:
        local = os.path.exists(model_path)
        if not local and not _HUB_ID_RE.match(model_path):
            raise DiagnoseError(f"--model {model_path!r}: no such directory (and not a hub id org/name)")
        try:
            model = AutoModelForCausalLM.from_pretrained(
                model_path, local_files_only=local, **{dtype_kw: torch_dtype}
            )
        except (OSError, ValueError, KeyError) as exc:
            raise DiagnoseError(f"cannot load model {model_path!r}: {_one_line(exc)}") from None
    model = model.to(device=device, dtype=torch_dtype)
    model.eval()
    return model


def _make_static_cache(model: Any, batch: int, max_len: int, device: str, torch_dtype: Any) -> Any:
    """A transformers StaticCache holding ``max_len`` tokens per sequence."""
    from transformers import StaticCache

    try:
        return StaticCache(config=model.config, max_cache_len=max_len)
    except TypeError:  # transformers 4.x signature
        return StaticCache(
            config=model.config, max_batch_size=batch, max_cache_len=max_len, device=device, dtype=torch_dtype
        )


def _metadata(
    model: Any,
    device: str,
    dtype: str,
    batch: int,
    prompt_len: int,
    decode_steps: int,
    cuda_graph: bool,
    warmup: int,
    seed: int,
) -> dict:
    """The JSON-serialisable run description stored under ``"diagnose"`` in the trace."""
    import torch
    import transformers

    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        device_properties = {
            "name": props.name,
            "total_memory": int(props.total_memory),
            "capability": f"{props.major}.{props.minor}",
            "multi_processor_count": int(props.multi_processor_count),
        }
    else:
        device_properties = {"name": platform.processor() or "cpu", "cpu_count": os.cpu_count()}
    return {
        "collector": COLLECTOR_ID,
        "model_config": _jsonable(model.config.to_dict()),
        "dtype": dtype,
        "device": device,
        "batch": batch,
        "prompt_len": prompt_len,
        "decode_steps": decode_steps,
        "cuda_graph": bool(cuda_graph),
        "warmup": warmup,
        "seed": seed,
        "prefill_logits_positions": prompt_len,  # naive HF forward: LM head over all S positions
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "device_properties": device_properties,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _jsonable(value: Any) -> Any:
    """Round-trip ``value`` through JSON, turning anything exotic (torch.dtype...) into str."""
    return json.loads(json.dumps(value, default=str))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _export(prof: Any, out: str) -> int:
    """Export the Chrome trace to ``out`` atomically (gzip when it ends in .gz); return its size."""
    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    umask = os.umask(0)
    os.umask(umask)
    fd, tmp_json = tempfile.mkstemp(dir=out_dir, prefix=".diagnose-", suffix=".json")
    os.close(fd)
    tmp_gz = None
    try:
        prof.export_chrome_trace(tmp_json)
        if out.endswith(".gz"):
            fd, tmp_gz = tempfile.mkstemp(dir=out_dir, prefix=".diagnose-", suffix=".json.gz")
            with os.fdopen(fd, "wb") as raw, open(tmp_json, "rb") as src:
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                    shutil.copyfileobj(src, gz, 1 << 20)
            final_tmp = tmp_gz
        else:
            final_tmp = tmp_json
        os.chmod(final_tmp, 0o666 & ~umask)
        os.replace(final_tmp, out)
    finally:
        for path in (tmp_json, tmp_gz):
            if path is not None and os.path.exists(path):
                os.unlink(path)
    return os.path.getsize(out)
