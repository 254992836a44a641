"""The op program records: :data:`PROGRAM_OPS` (each op's arguments, attributes and params), a
:class:`ProgramNode` and a :class:`Program`, read with every node checked against its op.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from nestflex.deploy.bundle._reading import _BAD, _extra, _failed, _join, _put, _Reader, _Record, _show

__all__ = [
    "PROGRAM_OPS",
    "ProgramNode",
    "Program",
]


@dataclass(frozen=True)
class _Op:
    """Signature of one program op: argument count, attributes (name -> kind, required) and params."""

    args: int | None  # exact count; None: one or more (output)
    literals: bool = False  # may an argument be a number instead of a node name (binary ops)
    attrs: Mapping[str, tuple[str, bool]] = field(default_factory=dict)
    params: tuple[str, ...] = ()  # required roles
    optional_params: tuple[str, ...] = ()
    per_level: bool = False  # may carry params_per_level (a switchable BatchNorm)


_UNARY = _Op(1)
_POOL_ATTRS = {"kernel_size": ("pos_pair", True), "stride": ("pos_pair", True), "padding": ("pair", True),
               "ceil_mode": ("bool", True)}
#: op name -> signature. ``nestflex.deploy.runtime`` runs exactly these (a test keeps the two in step).
PROGRAM_OPS: dict[str, _Op] = {
    "input": _Op(0),
    "output": _Op(None),
    "param": _Op(0, params=("value",)),
    "conv2d": _Op(1, attrs={"stride": ("pos_pair", True), "padding": ("pair", True), "dilation": ("pos_pair", True),
                            "groups": ("pos_int", True), "depthwise": ("bool", False)},
                  params=("weight",), optional_params=("bias",)),
    "linear": _Op(1, params=("weight",), optional_params=("bias",)),
    "batch_norm": _Op(1, attrs={"eps": ("eps", True)}, params=("running_mean", "running_var"),
                      optional_params=("weight", "bias"), per_level=True),
    "relu": _UNARY,
    "relu6": _UNARY,
    "identity": _UNARY,
    "max_pool2d": _Op(1, attrs={**_POOL_ATTRS, "dilation": ("pos_pair", True)}),
    "avg_pool2d": _Op(1, attrs={**_POOL_ATTRS, "count_include_pad": ("bool", True),
                                "divisor_override": ("opt_pos_int", False)}),
    "adaptive_avg_pool2d": _Op(1, attrs={"output_size": ("output_size", True)}),
    "adaptive_max_pool2d": _Op(1, attrs={"output_size": ("output_size", True)}),
    "flatten": _Op(1, attrs={"start_dim": ("int", True), "end_dim": ("int", True)}),
    "add": _Op(2, literals=True),
    "sub": _Op(2, literals=True),
    "mul": _Op(2, literals=True),
    "index_select": _Op(2, attrs={"dim": ("int", True)}),
    # transformers (issue 40): token tensors (N, T, C), attention over heads
    "layer_norm": _Op(1, attrs={"eps": ("eps", True), "channels": ("pos_int", True)},
                      optional_params=("weight", "bias")),
    "gelu": _UNARY,
    "softmax": _Op(1, attrs={"dim": ("int", True)}),
    "mean": _Op(1, attrs={"dim": ("int", True), "keepdim": ("bool", True)}),
    "transpose": _Op(1, attrs={"dim0": ("int", True), "dim1": ("int", True)}),
    "reshape": _Op(1, attrs={"shape": ("shape", True)}),
    "matmul": _Op(2),
}


@dataclass(frozen=True)
class ProgramNode:
    """One node of an op program (see :data:`PROGRAM_OPS`).

    Attributes:
        name: unique within its program; later nodes refer to it in ``args``.
        op: the op.
        args: earlier node names, or numbers (binary ops only).
        attrs: the op's attributes (``stride``, ``eps``, ...).
        params: role -> tensor name in ``weights.safetensors``, or ``None``.
        params_per_level: for a switchable BatchNorm, one ``params`` mapping per level.
    """

    name: str
    op: str
    args: tuple[str | int | float, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    params: dict[str, str] | None = None
    params_per_level: tuple[dict[str, str], ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def level_params(self, level: int) -> dict[str, str]:
        """The params this node reads at ``level`` (one mapping shared by every level, or the level's own)."""
        per = self.params_per_level
        if per:
            return per[level if len(per) > 1 else 0]
        return self.params or {}

    def tensor_names(self) -> list[str]:
        """Every tensor the node may read, at any level."""
        out = list((self.params or {}).values())
        for p in self.params_per_level or ():
            out += [t for t in p.values() if t not in out]
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "op": self.op}
        if self.args or self.op not in ("input", "param"):
            out["args"] = list(self.args)
        if self.attrs or self.op not in ("input", "output", "param"):
            out["attrs"] = dict(self.attrs)
        _put(out, "params", None if self.params is None else dict(self.params))
        _put(out, "params_per_level", None if self.params_per_level is None else [dict(p) for p in self.params_per_level])
        out.update(self.extra)
        return out


def _read_attr(r: _Reader, kind: str, v: Any, path: str) -> Any:
    if kind == "int":
        return r.int_(v, path)
    if kind == "pos_int":
        return r.int_(v, path, lo=1)
    if kind == "opt_pos_int":
        return r.int_(v, path, lo=1, null=True)
    if kind == "bool":
        return r.bool_(v, path)
    if kind == "eps":
        return r.num(v, path, lo=0, lo_open=True)
    if kind == "shape":  # a reshape's target: -1 (the batch) first, then positive sizes
        if (isinstance(v, (list, tuple)) and len(v) >= 2 and v[0] == -1 and not isinstance(v[0], bool)
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v[1:])):
            return list(v)
        return r.fail(path, f"must be [-1, sizes >= 1...] (the batch, then a sample's shape), got {_show(v)}")
    lo = 1 if kind in ("pos_pair", "output_size") else 0
    null_ok = kind == "output_size"  # adaptive pools: None keeps that dimension
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(
            (isinstance(x, int) and not isinstance(x, bool) and x >= lo) or (null_ok and x is None) for x in v):
        return list(v)
    if isinstance(v, int) and not isinstance(v, bool) and v >= lo:
        return v
    extra = " (null keeps that dimension)" if null_ok else ""
    return r.fail(path, f"must be an int >= {lo} or a list of two{extra}, got {_show(v)}")


@dataclass(frozen=True)
class Program(_Record):
    """An op program: nodes in execution order, the first ``input``, the last ``output``.

    In JSON a program is the list of its nodes. :meth:`from_json` checks every node: a known op,
    the op's argument count, arguments that name an *earlier* node (or numbers where the op takes
    them), the op's attributes with their types, and its params roles.
    """

    nodes: tuple[ProgramNode, ...]

    _PATH: ClassVar[str] = "program"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> Program | None:
        before = r.count
        v = r.seq(v, path, what="a list of program nodes")
        if v is _BAD:
            return None
        if not v:
            r.fail(path, "is empty; a program has at least an `input` and an `output` node")
            return None
        nodes: list[ProgramNode] = []
        defined: dict[str, str] = {}  # name -> op, in order
        for i, raw in enumerate(v):
            node = _read_node(r, raw, _join(path, i), defined)
            if node is not None:
                nodes.append(node)
            # a broken node still defines its name: later nodes that read it are not broken too
            name = raw.get("name") if isinstance(raw, Mapping) else None
            if isinstance(name, str) and name not in defined:
                op = raw.get("op")
                defined[name] = op if isinstance(op, str) and op in PROGRAM_OPS else "?"
        if _failed(r, before):
            return None
        ops = [n.op for n in nodes]
        if ops[0] != "input" or ops.count("input") != 1:
            r.fail(_join(path, 0), f"must be the program's one `input` node; ops are {_show(ops[:6])}")
        if ops[-1] != "output" or ops.count("output") != 1:
            r.fail(_join(path, len(ops) - 1), f"must be the program's one `output` node (the last); ops end "
                                               f"{_show(ops[-6:])}")
        return None if _failed(r, before) else cls(tuple(nodes))

    def to_json(self) -> list[dict[str, Any]]:
        return [n.to_json() for n in self.nodes]

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def node(self, name: str) -> ProgramNode | None:
        return next((n for n in self.nodes if n.name == name), None)

    def tensor_names(self) -> list[str]:
        """Every tensor the program may read (all levels), in first-use order."""
        out: list[str] = []
        for n in self.nodes:
            out += [t for t in n.tensor_names() if t not in out]
        return out


def _read_node(r: _Reader, v: Any, path: str, defined: Mapping[str, str]) -> ProgramNode | None:
    before = r.count
    v = r.obj(v, path)
    name = r.str_(r.get(v, "name", path), _join(path, "name"))
    if isinstance(name, str) and name in defined:
        r.fail(_join(path, "name"), f"repeats node name {name!r}; names are unique within a program")
    op = r.get(v, "op", path)
    spec = PROGRAM_OPS.get(op) if isinstance(op, str) else None
    if op is not _BAD and spec is None:
        r.fail(_join(path, "op"), f"names op {_show(op)}, which this runtime does not know; known: "
                                  f"{', '.join(sorted(PROGRAM_OPS))}. HINT: a newer nestflex may know it; upgrade nestflex")
        return None
    if spec is None:
        return None
    where = f"`{op}` node {name!r}" if isinstance(name, str) else f"`{op}` node"
    ap = _join(path, "args")
    args = r.get(v, "args", path, required=spec.args != 0)
    args = [] if args is None and spec.args == 0 else r.seq(args, ap)
    if args is not _BAD:
        if spec.args is not None and len(args) != spec.args:
            r.fail(ap, f"has {len(args)} arguments, a {where} takes {spec.args}, got {_show(args)}")
        elif spec.args is None and not args:
            r.fail(ap, f"is empty; a {where} returns at least one node")
        for i, a in enumerate(args):
            p = _join(ap, i)
            if isinstance(a, str):
                if a not in defined:
                    r.fail(p, f"names {a!r}, which is not an earlier node of this program (a {where} reads only "
                              f"nodes defined before it)")
                elif defined[a] == "output":
                    r.fail(p, f"names the `output` node {a!r}")
                elif op == "index_select" and i == 1 and defined[a] not in ("param", "?"):
                    r.fail(p, f"must name a `param` node (the index tensor), got node {a!r} ({defined[a]})")
            elif spec.literals and isinstance(a, (int, float)) and not isinstance(a, bool):
                r.num(a, p)
            else:
                kind = "a node name or a number" if spec.literals else "a node name"
                r.fail(p, f"must be {kind} (the {where} reads a tensor), got {_show(a)}")
        if spec.literals and len(args) == 2 and not any(isinstance(a, str) for a in args):
            r.fail(ap, f"must name at least one node (a {where} of two numbers is not a tensor), got {_show(args)}")
    attrs = r.obj(r.get(v, "attrs", path, required=bool(spec.attrs)), _join(path, "attrs"), null=not spec.attrs)
    if attrs is None:
        attrs = {}
    if attrs is not _BAD:
        for key, (kind, required) in spec.attrs.items():
            if key in attrs:
                _read_attr(r, kind, attrs[key], _join(_join(path, "attrs"), key))
            elif required:
                r.fail(_join(_join(path, "attrs"), key), f"is missing; a {where} needs it")
    params = _read_params(r, r.get(v, "params", path, required=False), _join(path, "params"), spec, where)
    per_level = r.get(v, "params_per_level", path, required=False)
    pp = _join(path, "params_per_level")
    if per_level is not None:
        if not spec.per_level:
            per_level = r.fail(pp, f"is not allowed on a {where} (only on batch_norm)")
        else:
            per_level = r.seq(per_level, pp)
            if per_level is not _BAD:
                if not per_level:
                    r.fail(pp, "is empty; it holds one params object per level")
                per_level = tuple(_read_params(r, p, _join(pp, k), spec, where, required=True)
                                  for k, p in enumerate(per_level))
        if params is not None and per_level is not _BAD:
            r.fail(pp, f"and `params` are both given on {where}; use one")
    elif spec.params and params is None:
        r.fail(_join(path, "params"), f"is missing; a {where} reads {', '.join(spec.params)}")
    if _failed(r, before):
        return None
    extra = _extra(v, ("name", "op", "args", "attrs", "params", "params_per_level"))
    return ProgramNode(name, op, tuple(args), attrs, params, per_level, extra)


def _read_params(r: _Reader, v: Any, path: str, spec: _Op, where: str, required: bool = False) -> Any:
    if v is None and not required:
        return None
    v = r.str_map(v, path)
    if v is _BAD:
        return v
    allowed = (*spec.params, *spec.optional_params)
    for role in v:
        if role not in allowed:
            r.fail(_join(path, role), f"is not a role a {where} reads; roles: {', '.join(allowed) or 'none'}")
    for role in spec.params:
        if role not in v:
            r.fail(_join(path, role), f"is missing; a {where} reads it")
    return v
