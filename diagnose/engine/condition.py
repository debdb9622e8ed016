"""The rule condition language: a Python-syntax expression checked against an allowlist when
a rule loads (never passed to ``eval``).

* findings are referenced with dots replaced by ``__`` (``decode.launch_gap_share`` ->
  ``decode__launch_gap_share``) and must be listed in the rule's ``requires``;
* thresholds by their bare name (declared under ``thresholds``);
* ``and or not``, unary ``-``/``+``, ``+ - * /``, comparisons ``< <= > >= == !=``
  (chains allowed), int/float/bool literals, and calls to ``min``, ``max``, ``abs``.

Anything else (attribute access, subscripts, other calls, ``**``, strings, lambdas,
comprehensions, conditional expressions...) raises :class:`RuleError` naming the file and
the construct.
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Any, Mapping

from diagnose.engine.errors import RuleError

Number = int | float
MAX_CONDITION_CHARS = 1000
MAX_CONDITION_NODES = 300

ALLOWED_FUNCTIONS = {"min": min, "max": max, "abs": abs}
_BINOPS = {ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub), ast.Mult: ("*", operator.mul), ast.Div: ("/", operator.truediv)}
_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne}
_ALLOWED_HELP = ("allowed: and/or/not, unary -, + - * /, comparisons, finding names (dots as '__'), "
                 "threshold names, int/float/bool literals, min() max() abs()")
_OP_SYMBOL = {ast.Pow: "**", ast.Mod: "%", ast.FloorDiv: "//", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>",
              ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^", ast.Invert: "~", ast.Is: "is", ast.IsNot: "is not",
              ast.In: "in", ast.NotIn: "not in"}


def mangle(finding: str) -> str:
    """``decode.launch_gap_share`` -> ``decode__launch_gap_share`` (the name used in conditions)."""
    return finding.replace(".", "__")


def unmangle(name: str) -> str:
    """Inverse of :func:`mangle`."""
    return name.replace("__", ".")


def _refuse(where: str, text: str, node: ast.AST, what: str) -> RuleError:
    seg = None
    try:
        seg = ast.get_source_segment(text, node)
    except Exception:  # noqa: BLE001 — only used for the message
        seg = None
    at = f" in {seg[:60]!r}" if seg else ""
    return RuleError(f"{where}: condition refused: {what}{at}; {_ALLOWED_HELP}")


def compile_condition(text: str, names: Mapping[str, str], where: str = "condition", want: str = "bool") -> ast.Expression:
    """Parse and check a condition; return its AST (evaluated by :func:`eval_condition`).

    Args:
        text: the expression.
        names: allowed names -> "finding" | "threshold" (mangled finding names).
        where: prefix for error messages (the rule file).

    Raises:
        RuleError: syntax error, a construct outside the allowlist, an unknown name, or an
            expression that is not a truth value.
    """
    if not isinstance(text, str) or not text.strip():
        raise RuleError(f"{where}: condition is empty")
    if len(text) > MAX_CONDITION_CHARS:
        raise RuleError(f"{where}: condition longer than {MAX_CONDITION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise RuleError(f"{where}: condition is not a valid expression: {e.msg} (column {e.offset})") from None
    except (RecursionError, MemoryError, ValueError) as e:
        raise RuleError(f"{where}: condition refused: too deeply nested or invalid ({type(e).__name__})") from None
    n_nodes = sum(1 for _ in ast.walk(tree))
    if n_nodes > MAX_CONDITION_NODES:
        raise RuleError(f"{where}: condition too large ({n_nodes} nodes > {MAX_CONDITION_NODES})")
    kind = _check(tree.body, names, where, text.strip())
    if kind != want:
        if want == "bool":
            raise RuleError(f"{where}: condition must be a truth value (a comparison, and/or/not), got an arithmetic expression")
        raise RuleError(f"{where}: expected a number (arithmetic over findings and thresholds), got a truth value")
    return tree


def compile_expression(text: str, names: Mapping[str, str], where: str = "expression") -> ast.Expression:
    """Parse and check a numeric expression (same language as conditions; e.g. a rule's
    ``stake_ms``); evaluate it with :func:`eval_expression`.

    Raises:
        RuleError: as :func:`compile_condition`, or an expression that is a truth value.
    """
    return compile_condition(text, names, where, want="num")


def eval_expression(tree: ast.Expression, env: Mapping[str, Number]) -> float:
    """Value of a tree from :func:`compile_expression` over ``env``.

    Raises:
        ZeroDivisionError, OverflowError, KeyError: arithmetic on, or a missing, value.
    """
    return float(_ev(tree.body, env))


def names_in(tree: ast.Expression) -> set[str]:
    """The (mangled) names an expression reads."""
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _check(node: ast.AST, names: Mapping[str, str], where: str, text: str) -> str:
    """Type-check one node: returns "bool" or "num"; raises RuleError on anything else."""
    t = type(node)
    if t is ast.BoolOp:
        for v in node.values:
            if _check(v, names, where, text) != "bool":
                raise _refuse(where, text, v, "operands of and/or must be comparisons or truth values")
        return "bool"
    if t is ast.UnaryOp:
        k = _check(node.operand, names, where, text)
        if isinstance(node.op, ast.Not):
            if k != "bool":
                raise _refuse(where, text, node, "'not' needs a truth value")
            return "bool"
        if isinstance(node.op, (ast.USub, ast.UAdd)):
            if k != "num":
                raise _refuse(where, text, node, "unary minus needs a number")
            return "num"
        raise _refuse(where, text, node, f"operator {_OP_SYMBOL.get(type(node.op), type(node.op).__name__)!r} is not allowed")
    if t is ast.BinOp:
        if type(node.op) not in _BINOPS:
            raise _refuse(where, text, node, f"operator {_OP_SYMBOL.get(type(node.op), type(node.op).__name__)!r} is not allowed")
        for side in (node.left, node.right):
            if _check(side, names, where, text) != "num":
                raise _refuse(where, text, side, "arithmetic needs numbers")
        return "num"
    if t is ast.Compare:
        for op in node.ops:
            if type(op) not in _CMPOPS:
                raise _refuse(where, text, node, f"comparison {_OP_SYMBOL.get(type(op), type(op).__name__)!r} is not allowed")
        for side in [node.left, *node.comparators]:
            if _check(side, names, where, text) != "num":
                raise _refuse(where, text, side, "comparisons need numbers")
        return "bool"
    if t is ast.Name:
        if node.id not in names:
            raise _refuse(
                where, text, node,
                f"unknown name {node.id!r} (a finding must be listed in requires and written with '__' "
                f"for dots; a threshold must be declared under thresholds)",
            )
        return "num"
    if t is ast.Constant:
        v = node.value
        if isinstance(v, bool):
            return "bool"
        if isinstance(v, (int, float)):
            if isinstance(v, float) and not math.isfinite(v):
                raise _refuse(where, text, node, "non-finite constant")
            return "num"
        raise _refuse(where, text, node, f"{type(v).__name__} constant is not allowed (numbers and True/False only)")
    if t is ast.Call:
        f = node.func
        if not isinstance(f, ast.Name) or f.id not in ALLOWED_FUNCTIONS:
            try:
                fname = f.id if isinstance(f, ast.Name) else ast.unparse(f)[:60]
            except Exception:  # noqa: BLE001 — message only
                fname = type(f).__name__
            raise _refuse(where, text, node, f"call to {fname!r} is not allowed (only min, max, abs)")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise _refuse(where, text, node, "keyword or starred arguments are not allowed")
        n = len(node.args)
        if (f.id == "abs" and n != 1) or (f.id in ("min", "max") and n < 2):
            raise _refuse(where, text, node, f"{f.id}() takes {'one argument' if f.id == 'abs' else 'two or more arguments'}")
        for a in node.args:
            if _check(a, names, where, text) != "num":
                raise _refuse(where, text, a, f"{f.id}() needs numbers")
        return "num"
    label = {ast.Attribute: "attribute access", ast.Subscript: "subscript", ast.Lambda: "lambda",
             ast.ListComp: "comprehension", ast.SetComp: "comprehension", ast.DictComp: "comprehension",
             ast.GeneratorExp: "generator expression", ast.IfExp: "conditional expression",
             ast.NamedExpr: "assignment expression", ast.JoinedStr: "f-string", ast.Tuple: "tuple",
             ast.List: "list", ast.Dict: "dict", ast.Set: "set", ast.Await: "await", ast.Starred: "starred expression",
             ast.Yield: "yield", ast.YieldFrom: "yield", ast.Slice: "slice"}.get(t, t.__name__)
    raise _refuse(where, text, node, f"{label} is not allowed")


def eval_condition(tree: ast.Expression, env: Mapping[str, Number]) -> bool:
    """Evaluate a tree from :func:`compile_condition` over ``env`` (mangled name -> number).

    Raises:
        ZeroDivisionError, OverflowError: arithmetic on the values (caller reports the rule
            as not evaluated).
    """
    return bool(_ev(tree.body, env))


def _ev(node: ast.AST, env: Mapping[str, Number]) -> Any:
    t = type(node)
    if t is ast.Compare:
        left = _ev(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _ev(comp, env)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if t is ast.BoolOp:
        if isinstance(node.op, ast.And):
            return all(_ev(v, env) for v in node.values)
        return any(_ev(v, env) for v in node.values)
    if t is ast.BinOp:
        return _BINOPS[type(node.op)][1](_ev(node.left, env), _ev(node.right, env))
    if t is ast.UnaryOp:
        v = _ev(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not v
        return -v if isinstance(node.op, ast.USub) else +v
    if t is ast.Name:
        return env[node.id]
    if t is ast.Constant:
        return node.value
    if t is ast.Call:
        return ALLOWED_FUNCTIONS[node.func.id](*(_ev(a, env) for a in node.args))
    raise RuleError(f"internal: unexpected node {t.__name__}")  # unreachable after compile_condition
