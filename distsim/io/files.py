"""The file edge: reading model, cluster and profile files; writing outputs atomically.

Every reader turns a missing or malformed file into a one-line DistsimError naming the file and the problem.
Writers go through :func:`distsim.io.output.open_output`: a regular file is replaced atomically (never half-written),
a device or FIFO is streamed to, a symbolic link is followed, ``-`` is standard output.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from distsim.core.checks import number, positive_int
from distsim.core.cluster import GPU, Cluster, Link, get_cluster
from distsim.core.errors import ClusterError, DistsimError, ModelFileError, ProfileError
from distsim.core.models import Model, get_model, model_from_dict
from distsim.core.models.hf import PREFIX as HF_PREFIX
from distsim.core.models.hf import model_from_hf_config, split_hf_spec
from distsim.io import yaml_guard
from distsim.io.output import STDOUT, open_output
from distsim.sim.profile_db import SCHEMA as PROFILE_SCHEMA
from distsim.sim.profile_db import ProfileDB

if TYPE_CHECKING:
    from distsim.sim.timeline import Timeline


def _looks_like_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml", ".json")) or os.sep in name or Path(name).exists()


MiB = 2**20
MAX_FILE_BYTES = {"model": 4 * MiB, "cluster": 1 * MiB, "framework": 1 * MiB, "plan": 1 * MiB, "profile": 64 * MiB,
                  "trace": 256 * MiB}  # fmt: skip
"""Largest file each reader accepts, checked before reading; a YAML document's aliases may not expand it past the
same size. The shipped files are far below: profiles up to 165 KB, measured traces up to 563 KB, models, clusters
and plans a few KB (a model listing MAX_LAYERS layers one per line is about 1 MB). Parsing costs about 5x the file
in memory for JSON and far more for YAML: a 4 MiB YAML model file took 9 s and 0.34 GB to read (libyaml, AMD EPYC)."""


def read_structured(
    path: str | Path, error: type[DistsimError], kind: str | None = None, as_json: bool | None = None
) -> Any:
    """Parse a YAML or JSON file of a `kind` in MAX_FILE_BYTES (None: the largest but a trace's); errors name the
    file. `as_json`: parse it as JSON whatever its name (None: JSON if it ends in .json, else YAML)."""
    p = Path(path)
    max_bytes = MAX_FILE_BYTES[kind] if kind else MAX_FILE_BYTES["profile"]
    limit = f"the limit of {max_bytes:,} bytes for a {kind or 'structured'} file"
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise error(f"{p}: the file is {size:,} bytes, above {limit}")
        with p.open("rb") as fh:
            data = fh.read(max_bytes + 1)  # a pipe or device reports no size
        if len(data) > max_bytes:
            raise error(f"{p}: the file is larger than {limit}")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise error(f"{p}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise error(f"{p}: cannot read ({exc.__class__.__name__})") from None
    try:
        if as_json or (as_json is None and p.suffix == ".json"):
            return json.loads(text)
        return yaml_guard.load(text, max_chars=max_bytes)
    except json.JSONDecodeError as exc:
        raise error(f"{p}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise error(f"{p}: malformed YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except yaml_guard.ExpansionError as exc:
        raise error(f"{p}: refused: {exc}") from None
    except RecursionError:
        raise error(f"{p}: nested too deeply to read") from None
    except ValueError as exc:  # e.g. an integer literal of more than 4300 digits
        raise error(f"{p}: malformed file: {exc}") from None


def read_hf_config(path: str) -> tuple[dict[str, Any], str]:
    """A Hugging Face config (`path`: a config.json, or a directory holding one) parsed as JSON, and the file's
    path; errors name the file."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
        if not p.exists():
            raise ModelFileError(f"{path}: a directory without a config.json; hf: takes a Hugging Face config.json "
                                 "or the directory holding it")  # fmt: skip
    data = read_structured(p, ModelFileError, "model", as_json=True)
    if not isinstance(data, dict):
        raise ModelFileError(f"{p}: a Hugging Face config is a JSON object, got a {type(data).__name__}")
    return data, str(p)


def load_model(name_or_path: str) -> Model:
    """A zoo model by name, a model described in a YAML/JSON file, the layer graph a profile of a torch module
    holds (``distsim profile --torch-model``), or ``hf:PATH[:seq=N,precision=P,...]``: the model a Hugging Face
    config.json (or the directory holding one) describes (:mod:`distsim.core.models.hf`: GPT-2, Llama, Mistral,
    Qwen2; seq defaults to min(max_position_embeddings, 4096))."""
    if name_or_path.startswith(HF_PREFIX):
        path, overrides = split_hf_spec(name_or_path)
        config, where = read_hf_config(path)
        return model_from_hf_config(config, where, overrides)
    if _looks_like_path(name_or_path):
        data = read_structured(name_or_path, ModelFileError, "model")
        if isinstance(data, dict) and data.get("schema") == PROFILE_SCHEMA:
            model = ProfileDB.from_dict(data, where=str(name_or_path)).model
            if model is None:
                raise ModelFileError(f"{name_or_path}: a profile without a model (measured for --model NAME|FILE); "
                                     "give that model as --model and this file as --profile")  # fmt: skip
            return model_from_dict(model, where=f"{name_or_path} model")
        return model_from_dict(data, where=str(name_or_path))
    return get_model(name_or_path)


def is_model_profile(name_or_path: str) -> bool:
    """Whether a --model argument names a profile that holds its model (and so also serves as --profile)."""
    if name_or_path.startswith(HF_PREFIX) or not (name_or_path.endswith(".json") and os.path.isfile(name_or_path)):
        return False
    try:
        data = read_structured(name_or_path, ModelFileError, "model")
    except DistsimError:
        return False
    return isinstance(data, dict) and data.get("schema") == PROFILE_SCHEMA and data.get("model") is not None


_CLUSTER_KEYS = {"base", "name", "nodes", "gpus_per_node", "gpu", "intra", "inter", "nics_per_node", "source"}
_GPU_KEYS = {f.name for f in fields(GPU)}
_LINK_KEYS = {f.name for f in fields(Link)}


_TEXT_KEYS = {"base", "name", "source"}
_INT_KEYS = {"nodes", "gpus_per_node", "nics_per_node", "sm_count"}
_NESTED_KEYS = {"gpu", "intra", "inter"}


def _subset(data: Any, allowed: set[str], where: str) -> dict[str, Any]:
    """Check keys and turn every figure into a number, naming the first that is not one."""
    if not isinstance(data, dict):
        raise ClusterError(f"{where}: expected a mapping")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ClusterError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _TEXT_KEYS or key in _NESTED_KEYS:  # nested mappings are checked on their own
            out[key] = value
        elif key in _INT_KEYS:
            out[key] = positive_int(value, f"{where}: {key}", ClusterError)
        else:
            out[key] = number(value, f"{where}: {key}", ClusterError)
    return out


def cluster_from_dict(data: Any, where: str) -> Cluster:
    """A cluster file: a preset to start from (``base``) and any figures to override, or a full description.

    Example: ``{base: dgx-a100, nodes: 16, inter: {bandwidth_bytes_per_s: 12.5e9}}``.
    """
    data = _subset(data, _CLUSTER_KEYS, where)
    if "base" in data:
        base = get_cluster(str(data["base"]))
    else:
        missing = [k for k in ("nodes", "gpus_per_node", "gpu", "intra", "inter") if k not in data]
        if missing:
            raise ClusterError(f"{where}: needs {', '.join(missing)} (or base: <preset> to start from)")
        base = None
    gpu_over = _subset(data.get("gpu", {}), _GPU_KEYS, f"{where} gpu")
    link_over = {key: _subset(data.get(key, {}), _LINK_KEYS, f"{where} {key}") for key in ("intra", "inter")}
    top = {k: data[k] for k in ("name", "nodes", "gpus_per_node", "nics_per_node", "source") if k in data}
    try:
        gpu = replace(base.gpu, **gpu_over) if base else GPU(**gpu_over)
        links = {k: replace(getattr(base, k), **over) if base else Link(**over) for k, over in link_over.items()}
        if base:
            return replace(base, gpu=gpu, **links, **top)
        return Cluster(gpu=gpu, **links, **{"name": "custom", "source": where, **top})
    except TypeError as exc:
        raise ClusterError(f"{where}: malformed cluster description ({exc})") from None
    except ClusterError as exc:  # the cluster's own consistency checks name the cluster, not the file
        raise ClusterError(f"{where}: {exc}") from None


def load_cluster(name_or_path: str) -> Cluster:
    if _looks_like_path(name_or_path):
        data = read_structured(name_or_path, ClusterError, "cluster")
        return cluster_from_dict(data, str(name_or_path))
    return get_cluster(name_or_path)


def load_framework(name_or_path: str) -> Any:
    """A framework preset by name (:data:`distsim.core.framework.FRAMEWORKS`) or a framework file (YAML or JSON)."""
    from distsim.core.framework import FrameworkError, framework_from_dict, get_framework

    if _looks_like_path(name_or_path):
        return framework_from_dict(read_structured(name_or_path, FrameworkError, "framework"), str(name_or_path))
    return get_framework(name_or_path)


def load_profile(path: str | Path) -> ProfileDB:
    p = Path(path)
    if p.suffix != ".json":
        raise ProfileError(f"{p}: a profile database is a .json file")
    return ProfileDB.from_dict(read_structured(p, ProfileError, "profile"), where=str(p))


def load_plan(path: str | Path) -> Any:
    """A plan file (YAML or JSON): see :mod:`distsim.plans.plan`."""
    from distsim.plans import PlanError, plan_from_dict

    return plan_from_dict(read_structured(path, PlanError, "plan"), where=str(path))


def write_plan(path: str | Path, plan: Any) -> Path:
    """Write a plan as YAML (.yaml/.yml) or JSON (.json), with a header comment saying what it is."""
    from distsim.plans import plan_to_dict

    data = plan_to_dict(plan)
    if Path(path).suffix == ".json":
        return write_json(path, data, indent=2)
    header = f"# distsim plan: `distsim simulate --plan {Path(path).name}` simulates it\n"
    return write_text(path, header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110))


def load_trace(path: str | Path) -> Any:
    from distsim.io.trace import Trace, TraceError

    return Trace.from_dict(read_structured(path, TraceError, "trace"), where=str(path))


def _write(path: str | Path, write: Callable[[Any], None], binary: bool = False) -> Path:
    """Write an output with `write(file)`; see :mod:`distsim.io.output` for what each kind of path gets."""
    with open_output(path, binary=binary) as fh:
        write(fh)
    return Path(path)


def write_json(path: str | Path, obj: Any, indent: int | None = None) -> Path:
    return _write(path, lambda fh: json.dump(obj, fh, indent=indent, separators=None if indent else (",", ":")))


def write_chrome_trace(
    path: str | Path,
    trace: Timeline | Iterable[dict[str, Any]],
    title: str,
    *,
    expand: bool = False,
    report: Callable[[str], None] | None = None,
    warn_bytes: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write a Chrome/Perfetto trace of a timeline, streaming (memory stays flat for millions of events).

    The format follows the name: ``*.json.gz`` gzip-compressed JSON, ``*.pftrace`` (or ``*.perfetto-trace``)
    Perfetto's protobuf format, anything else JSON (see :mod:`distsim.io.trace_export`). `expand`: every GPU's rows,
    not one row set per group of identical GPUs. `report`, when given, gets one warning line before the write if the
    trace is estimated above `warn_bytes` uncompressed (default :data:`~distsim.io.trace_export.WARN_BYTES`);
    `progress(done, total)` is called with events written. `trace` may also be trace events as dicts (JSON formats
    only). The exporter (with pandas) is imported here, when a trace is written."""
    from distsim.io.trace_export import WARN_BYTES, TraceSource, estimate, trace_format, warning_text, write_trace

    warn_bytes = WARN_BYTES if warn_bytes is None else warn_bytes
    from distsim.sim.timeline import Timeline

    fmt = trace_format(path)
    if not isinstance(trace, Timeline):
        if fmt == "pftrace":
            raise DistsimError(f"{path}: a Perfetto protobuf trace is written from a Timeline, not from events")
        return _write(path, lambda fh: _write_event_dicts(fh, trace, title, gz=fmt == "json.gz"), binary=True)
    src = TraceSource(trace, expand)
    if report is not None:
        est = estimate(src, fmt)
        if est.loaded_bytes > warn_bytes:
            report(warning_text(path, est, src))
    return _write(path, lambda fh: write_trace(fh, src, fmt, title, progress), binary=True)


def _write_event_dicts(fh: Any, events: Iterable[dict[str, Any]], title: str, gz: bool) -> None:
    if gz:
        import gzip

        from distsim.io.trace_export import GZIP_LEVEL

        with gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=GZIP_LEVEL, mtime=0) as out:
            _write_event_dicts(out, events, title, gz=False)
        return
    fh.write(b'{"displayTimeUnit":"ms","otherData":' + json.dumps({"title": title}).encode() + b',"traceEvents":[\n')
    for i, event in enumerate(events):
        fh.write((",\n" if i else "").encode() + json.dumps(event, separators=(",", ":")).encode())
    fh.write(b"\n]}\n")


def write_text(path: str | Path, text: str) -> Path:
    return _write(path, lambda fh: fh.write(text))


def _write_table(path: str | Path, write: Callable[[Any], None]) -> Path:
    """Write a text table; a name ending in ``.gz`` gets it gzip-compressed."""
    if not str(path).endswith(".gz"):
        return _write(path, write)

    def compressed(fh: Any) -> None:
        with gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as gz, io.TextIOWrapper(gz, "utf-8") as text:
            write(text)

    return _write(path, compressed, binary=True)


def write_csv(path: str | Path, df: Any) -> Path:
    """A table as CSV (``*.csv.gz``: gzip-compressed)."""
    return _write_table(path, lambda fh: df.to_csv(fh, index=False))


def write_timeline_csv(path: str | Path, timeline: Timeline, expand: bool = False) -> Path:
    """A timeline as CSV (``*.csv.gz``: gzip-compressed); `expand`: every GPU's rows, written one simulated GPU at a
    time (never all in memory)."""
    from distsim.io.trace_export import write_csv as write_timeline

    return _write_table(path, lambda fh: write_timeline(fh, timeline, expand))


def write_figure(path: str | Path, fig: Any, dpi: int = 120) -> Path:
    suffix = Path(path).suffix.lstrip(".").lower() if str(path) != STDOUT else ""
    return _write(path, lambda fh: fig.savefig(fh, format=suffix or "png", dpi=dpi, bbox_inches="tight"), binary=True)
