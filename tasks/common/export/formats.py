"""The three formats ``rescale export`` writes, each written, read back and run on real inputs.

Every format starts from one :func:`torch.export.export` capture of the network in evaluation
(an :class:`~torch.export.ExportedProgram`: ATen operators only, no Python modules or hooks):

- ``onnx``: converted by ``torch.onnx.export`` (its ExportedProgram-based exporter, which needs
  ``onnx`` and ``onnxscript``), saved, and run in ``onnxruntime`` on the CPU;
- ``exported-program``: ``torch.export.save``, read back with ``torch.export.load``;
- ``torchscript``: the module of an ExportedProgram captured at the real inputs' sizes, traced by
  ``torch.jit.trace`` (a graph of ATen calls, so nothing of the suite's Python code is left to
  script; the tracer cannot follow symbolic sizes), saved and read back with ``torch.jit.load``.
  torch 2.14 marks TorchScript deprecated; it is here for runtimes that still read it (LibTorch).

:data:`FORMATS` maps each name to its :class:`Format`; :func:`require_packages` refuses, in one
line, a format whose packages are not installed.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch

from ..errors import UserError

__all__ = ["Format", "FORMATS", "INSTALL_HINT", "require_packages", "evaluating", "capture", "op_counts",
           "varying_sizes", "size_one_runs", "size_names", "input_specs", "tensors_of", "max_difference",
           "ONNX_EXTERNAL_DATA_BYTES", "onnx_data_path"]

INSTALL_HINT = 'pip install "rescale-suite[export]" (from a clone: pip install -e ".[export]", or make install)'


@dataclass(frozen=True)
class Format:
    """One export format: the file suffix, the packages it needs, what runs the file read back,
    ``save_and_load(program, inputs, path) -> outputs`` (the file's outputs on ``inputs``), and
    whether it needs the program captured at the inputs' sizes (``static``; ``load(path)``: the file
    read back as a callable, to check it at other sizes), and ``move(path, to)``: the file moved, with
    any it writes beside its own (ONNX's external data), the two still a pair."""

    suffix: str
    packages: tuple[str, ...]
    runtime: str
    save_and_load: Callable[[torch.export.ExportedProgram, tuple, str], Any]
    static: bool = False
    load: Optional[Callable[[str], Callable]] = None
    move: Callable[[str, str], None] = os.replace


def require_packages(names: list[str]) -> None:
    """One :class:`UserError` line naming the packages the formats ``names`` need and lack."""
    missing = []
    for name in names:
        for package in FORMATS[name].packages:
            try:
                importlib.import_module(package)
            except ImportError:
                if package not in missing:
                    missing.append(package)
    if missing:
        raise UserError(f"rescale export --format {' '.join(names)} needs {', '.join(missing)}, not installed in "
                        f"this environment: {INSTALL_HINT}")


def evaluating(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` in eval mode; left as it is when it already is (switching modes drops the weights
    the inference plan folded, which a capture then reads as constants)."""
    if any(m.training for m in module.modules()):
        module.eval()
    return module


def capture(module: torch.nn.Module, inputs: tuple, dynamic_shapes: Any = None) -> torch.export.ExportedProgram:
    """``module(*inputs)`` captured by :func:`torch.export.export` as it computes in evaluation:
    eval mode, autograd off, so the network runs its inference plan (from the weights it folded on
    an earlier evaluation call, if any: a plain network with folded constants)."""
    with torch.no_grad():
        return torch.export.export(evaluating(module), inputs, dynamic_shapes=dynamic_shapes)


def op_counts(program: torch.export.ExportedProgram) -> Counter:
    """The ATen operators an ExportedProgram calls, by name (``aten.conv2d.default`` ...),
    without the tuple unpacking (``getitem``) that is no operation."""
    return Counter(str(node.target) for node in program.graph.nodes
                   if node.op == "call_function" and getattr(node.target, "__name__", "") != "getitem")


def _free_dims(program: torch.export.ExportedProgram) -> list[tuple[str, int, Any]]:
    """``(input name, dim, size expression)`` of every input size the program leaves free, in
    input order (the user inputs' placeholders)."""
    user_inputs = set(program.graph_signature.user_inputs)
    return [(node.name, dim, size.node.expr) for node in program.graph.nodes
            if node.op == "placeholder" and node.name in user_inputs
            for dim, size in enumerate(getattr(node.meta.get("val"), "shape", ()))
            if isinstance(size, torch.SymInt)]


def _lower_bound(program: torch.export.ExportedProgram, symbol: Any) -> int:
    bounds = program.range_constraints.get(symbol)
    return int(bounds.lower) if bounds is not None else 1


def size_one_runs(program: torch.export.ExportedProgram, module: torch.nn.Module, inputs: tuple,
                  bound: float, runner: Optional[Callable] = None) -> set:
    """The free sizes the capture took as 2 or more (:func:`torch.export.export` traces with
    sizes 0 and 1 set apart) that nonetheless compute right at 1: for each, the inputs cut to 1
    along every dimension of that size, the program's outputs (or ``runner``'s: a file read back)
    within ``bound`` of the module's."""
    names = [n.name for n in program.graph.nodes if n.op == "placeholder"
             and n.name in set(program.graph_signature.user_inputs)]
    dims: dict[Any, list[tuple[int, int]]] = {}
    for name, dim, expr in _free_dims(program):
        if expr.is_Symbol:
            dims.setdefault(expr, []).append((names.index(name), dim))
    exported, right = runner if runner is not None else program.module(), set()
    for symbol, where in dims.items():
        if _lower_bound(program, symbol) != 2:
            continue
        cut = list(inputs)
        for index, dim in where:
            cut[index] = cut[index].narrow(dim, 0, 1)
        try:
            with torch.no_grad():
                if max_difference(exported(*cut), evaluating(module)(*cut)) <= bound:
                    right.add(symbol)
        except Exception:  # a size 1 the program cannot take (a guard, a broadcast): left at 2+
            pass
    return right


def varying_sizes(program: torch.export.ExportedProgram, right_at_one: set = frozenset()) -> str:
    """The input sizes ``program`` leaves free, each named once by its first input, with the range
    it may take (``x[0] 1+``, ``src_tokens[1] 2+``), ``;``-separated; empty when every size is
    fixed. ``right_at_one``: the sizes :func:`size_one_runs` found right at 1 (their range starts
    there). A network that computes differently by size (a plan choosing its ops by the tensors'
    sizes) bounds the ranges."""
    parts, named = [], set()
    for name, dim, expr in _free_dims(program):
        if expr.free_symbols <= named:
            continue
        named |= expr.free_symbols
        parts.append(f"{name}[{dim}] {_size_range(program, expr, right_at_one)}")
    return "; ".join(parts)


def _size_range(program: torch.export.ExportedProgram, expr: Any, right_at_one: set) -> str:
    """The range a free size may take: ``1+``, ``0-255`` (from 1 where it is in ``right_at_one``)."""
    bounds = program.range_constraints.get(expr)
    low, high = (bounds.lower, bounds.upper) if bounds is not None else (1, None)
    if expr in right_at_one:
        low = 1
    return f"{low}{'+' if high is None or not str(high).isdigit() else f'-{high}'}"


def input_specs(program: torch.export.ExportedProgram, inputs: tuple, right_at_one: set = frozenset()) -> list[dict]:
    """Each input of ``program`` as a runtime needs it: ``name`` (the ONNX input's too), ``shape`` and
    ``dtype`` of the real sample it was checked on, and ``free``: each size that may vary, by
    dimension, as its range (``"1+"``, ``"0-255"``; :func:`varying_sizes`) where it first appears,
    else as the size it equals (``"x[0]"``, ``"key_padding[1] + 1"``)."""
    names = [n.name for n in program.graph.nodes if n.op == "placeholder"
             and n.name in set(program.graph_signature.user_inputs)]
    first: dict[Any, str] = {}
    free: dict[str, dict[str, str]] = {name: {} for name in names}
    for name, dim, expr in _free_dims(program):
        if expr.is_Symbol and expr not in first:
            first[expr] = f"{name}[{dim}]"
            free[name][str(dim)] = _size_range(program, expr, right_at_one)
        else:
            text = str(expr)
            for symbol in sorted(expr.free_symbols, key=str, reverse=True):
                text = text.replace(str(symbol), first.get(symbol, str(symbol)))
            free[name][str(dim)] = text
    return [{"name": name, "shape": list(t.shape), "dtype": str(t.dtype)[len("torch."):], "free": free[name]}
            for name, t in zip(names, tensors_of(inputs))]


def size_names(program: torch.export.ExportedProgram, symbols: set) -> list[str]:
    """Each of the free sizes ``symbols`` named by its first input (``x[0]``), in input order."""
    names, named = [], set()
    for name, dim, expr in _free_dims(program):
        if expr in symbols and expr not in named:
            named.add(expr)
            names.append(f"{name}[{dim}]")
    return names


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors of a nested output (tensors, tuples, lists, dicts in their order)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_of(item)]
    return []


def max_difference(outputs: Any, reference: Any) -> float:
    """The largest absolute difference between two nested outputs of the same structure (for
    outputs other than floating point, 1 where any element differs)."""
    mine, theirs = tensors_of(outputs), tensors_of(reference)
    if len(mine) != len(theirs):
        raise UserError(f"the exported file gives {len(mine)} outputs where the PyTorch model gives {len(theirs)}")
    worst = 0.0
    for a, b in zip(mine, theirs):
        a = torch.as_tensor(a)
        if tuple(a.shape) != tuple(b.shape):
            raise UserError(f"the exported file gives an output of shape {tuple(a.shape)} where the PyTorch model "
                            f"gives {tuple(b.shape)}")
        if b.numel():  # masks and token ids: 1 where any differs
            worst = max(worst, float((a.double() - b.double()).abs().max()) if b.is_floating_point()
                        else float(bool((a != b).any())))
    return worst


# --- the formats -------------------------------------------------------------------------------------

#: Weights above this many bytes are saved beside the ONNX file, as ``<file>.data`` (external data;
#: torch's exporter does so above its own threshold too, a protobuf file holding at most 2 GB).
ONNX_EXTERNAL_DATA_BYTES = 1536 * 1024 * 1024


def onnx_data_path(path: str) -> str:
    """Where the ONNX file at ``path`` keeps its weights when they are saved as external data."""
    return f"{path}.data"


def _onnx(program: torch.export.ExportedProgram, inputs: tuple, path: str) -> list:
    # an optional dependency (the export extra): imported only when this format is asked for
    import onnxruntime

    with contextlib.redirect_stdout(io.StringIO()):  # the exporter's progress lines
        onnx_program = torch.onnx.export(program, inputs, dynamo=True, verbose=False)
    weights = sum(t.numel() * t.element_size() for t in (*program.state_dict.values(), *program.constants.values())
                  if isinstance(t, torch.Tensor))
    onnx_program.save(path, external_data=True if weights > ONNX_EXTERNAL_DATA_BYTES else None)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    # the graph's inputs by name: an input the computation does not read is not one of them
    wanted = {arg.name for arg in session.get_inputs()}
    feeds = {name: t.detach().cpu().numpy() for name, t in zip(program.graph_signature.user_inputs, inputs)
             if name in wanted}
    return [torch.from_numpy(out) for out in session.run(None, feeds)]


def _move_onnx(path: str, to: str) -> None:
    """The ONNX file at ``path`` moved to ``to``; with external data, that moved to ``<to>.data`` and
    the file rewritten to name it (the file names its data file: a renamed pair no longer loads);
    without, an earlier file's ``<to>.data`` removed (no stale weights beside a file holding its own)."""
    if not os.path.exists(onnx_data_path(path)):
        if os.path.isfile(onnx_data_path(to)):
            os.remove(onnx_data_path(to))
        os.replace(path, to)
        return
    import onnx

    model = onnx.load(path)  # the weights read from the data file, into the model
    staged = os.path.join(os.path.dirname(path), os.path.basename(to))
    for stale in (staged, onnx_data_path(staged)):  # onnx appends to an existing data file
        if os.path.exists(stale):
            os.remove(stale)
    onnx.save_model(model, staged, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=os.path.basename(onnx_data_path(to)))
    os.replace(onnx_data_path(staged), onnx_data_path(to))
    os.replace(staged, to)


def _write_through_memory(save: Callable[[io.BytesIO], None], path: str) -> None:
    """``save(buffer)`` (one of torch's archive writers) into memory, then the bytes to ``path`` by
    Python: given a path, torch's C++ file writer aborts the whole process when the disk fills
    (``terminate called after throwing an instance of 'c10::Error'``, no cleanup run), where a
    Python write fails with an ``OSError`` that ``rescale export`` reports in one line."""
    buffer = io.BytesIO()
    save(buffer)
    with open(path, "wb") as f:
        f.write(buffer.getbuffer())


def _exported_program(program: torch.export.ExportedProgram, inputs: tuple, path: str) -> Any:
    _write_through_memory(lambda buffer: torch.export.save(program, buffer), path)
    with torch.no_grad():
        return torch.export.load(path).module()(*inputs)


@contextlib.contextmanager
def _quiet_torchscript() -> Iterator[None]:
    """torch 2.14's deprecation notice on every ``torch.jit`` call, and the tracer's notice on the
    ExportedProgram's own shape checks (host reads it records as constants, as they are)."""
    with warnings.catch_warnings():
        for call in ("trace", "trace_method", "save", "load"):
            warnings.filterwarnings("ignore", message=rf"`torch\.jit\.{call}` is deprecated")
        warnings.filterwarnings("ignore", message="Converting a tensor to a Python boolean might cause the trace")
        yield


def _load_torchscript(path: str) -> Callable:
    """The TorchScript file at ``path`` read back: a callable run without autograd."""
    with _quiet_torchscript():
        loaded = torch.jit.load(path)

    def run(*inputs: Any) -> Any:
        with _quiet_torchscript(), torch.no_grad():
            return loaded(*inputs)
    return run


def _torchscript(program: torch.export.ExportedProgram, inputs: tuple, path: str) -> Any:
    with _quiet_torchscript(), torch.no_grad():
        traced = torch.jit.trace(program.module(), inputs, strict=False)
        _write_through_memory(lambda buffer: torch.jit.save(traced, buffer), path)
    return _load_torchscript(path)(*inputs)


FORMATS: dict[str, Format] = {
    "onnx": Format(".onnx", ("onnx", "onnxscript", "onnxruntime"), "onnxruntime", _onnx, move=_move_onnx),
    "exported-program": Format(".pt2", (), "torch.export.load", _exported_program),
    "torchscript": Format(".torchscript.pt", (), "torch.jit.load", _torchscript, static=True, load=_load_torchscript),
}
