"""The Python API's argument checks, in one place: every public function declares what each of
its arguments must be (``@checked(model_file=path_arg, batch_num=opt(positive_int))``) and a wrong type
or value is an ``ArgumentError`` naming the function and the argument, before any work.

Why: a script passing ``pathlib.Path``, ``b"..."``, ``2.0`` or a string where a list belongs
met JSON serialisation errors, ``AttributeError`` deep inside, or a string read character by
character. Paths take ``str`` or ``os.PathLike`` (returned as ``str``, so that everything below
sees one type); whole numbers refuse floats and bools. Torch-free.
"""
from __future__ import annotations

import functools
import inspect
import math
import os
from collections.abc import Sequence
from typing import Any, Callable, TypeVar

from amct_torch.errors import ArgumentError

__all__ = ["ArgumentError", "check_values", "checked"]

Check = Callable[[Any, str], Any]
F = TypeVar("F", bound=Callable[..., Any])


def _kind(value: Any) -> str:
    return type(value).__name__


def path_arg(value: Any, name: str) -> str:
    """A path: ``str`` or ``os.PathLike`` of ``str`` (not bytes, not empty), as ``str``."""
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        text = os.fspath(value)
        if isinstance(text, str) and text:
            return text
        if isinstance(text, str):
            raise ArgumentError(f"{name} is an empty path")
    raise ArgumentError(f"{name} must be a path (str or os.PathLike), got {_kind(value)}")


def _whole_at_least(low: int) -> Check:
    """A whole number >= ``low`` (an ``int``, not a bool or a float such as 2.0)."""
    def check(value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentError(f"{name} must be an integer, got {_kind(value)} {value!r}")
        if value < low:
            raise ArgumentError(f"{name} must be >= {low}, got {value}")
        return value
    return check


positive_int = _whole_at_least(1)
non_negative_int = _whole_at_least(0)


def bool_arg(value: Any, name: str) -> bool:
    """True or False (not 0/1, not "yes")."""
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be True or False, got {_kind(value)} {value!r}")
    return value


def number_arg(value: Any, name: str) -> float:
    """A finite real number (not a bool, not a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ArgumentError(f"{name} must be a finite number, got {_kind(value)} {value!r}")
    return float(value)


def numbers_arg(value: Any, name: str) -> list[float]:
    """One number or a sequence of numbers (never a string: "104" is not 1, 0, 4)."""
    if isinstance(value, (str, bytes)):
        raise ArgumentError(f"{name} must be a number or a list of numbers, got a string {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [number_arg(value, name)]
    try:
        items = list(value)
    except TypeError:
        raise ArgumentError(f"{name} must be a number or a list of numbers, got {_kind(value)}") from None
    if not items:
        raise ArgumentError(f"{name} must hold at least one number")
    return [number_arg(v, f"{name}[{i}]") for i, v in enumerate(items)]


def sizes_arg(value: Any, name: str) -> Any:
    """One positive size or (H, W)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return positive_int(value, name)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) not in (1, 2):
        raise ArgumentError(f"{name} must be one positive size or (H, W), got {value!r}")
    return [positive_int(v, f"{name}[{i}]") for i, v in enumerate(value)]


def names_arg(value: Any, name: str) -> list[str]:
    """A list of names (layer or blob names); a single string is refused (not split by letter)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or \
            not all(isinstance(v, str) for v in value):
        raise ArgumentError(f"{name} must be a list of names (str), got {value!r:.80}")
    return list(value)


def torch_module(value: Any, name: str) -> Any:
    """A torch ``nn.Module`` (told without importing torch: it has ``named_modules``)."""
    if not callable(getattr(value, "named_modules", None)):
        raise ArgumentError(f"{name} must be a torch nn.Module, got {_kind(value)}")
    return value


def graph_module(value: Any, name: str) -> Any:
    """A torch.fx ``GraphModule`` (a loaded Caffe model, ``load_caffe``'s result)."""
    if not callable(getattr(value, "named_modules", None)) or not hasattr(value, "graph"):
        raise ArgumentError(f"{name} must be a torch.fx GraphModule such as load_caffe() returns, "
                            f"got {_kind(value)}")
    return value


def sequence_of(cls: type) -> Check:
    """A list or tuple of ``cls`` instances (not a string)."""
    def check(value: Any, name: str) -> Any:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or \
                not all(isinstance(v, cls) for v in value):
            raise ArgumentError(f"{name} must be a list of {cls.__name__}, got {_kind(value)}")
        return value
    return check


def one_of(*choices: Any) -> Check:
    """One of ``choices`` exactly."""
    def check(value: Any, name: str) -> Any:
        if isinstance(value, bool) or value not in choices:
            raise ArgumentError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r:.80}")
        return value
    return check


def instance(*types: type, what: str = "") -> Check:
    """An instance of ``types`` (``what`` says it in words)."""
    def check(value: Any, name: str) -> Any:
        if not isinstance(value, types):
            want = what or " or ".join(t.__name__ for t in types)
            raise ArgumentError(f"{name} must be {want}, got {_kind(value)}")
        return value
    return check


def opt(check: Check) -> Check:
    """``check``, or None."""
    def optional(value: Any, name: str) -> Any:
        return None if value is None else check(value, name)
    return optional


def either(*checks: Check) -> Check:
    """The first of ``checks`` that accepts the value (the last one's error otherwise)."""
    def check(value: Any, name: str) -> Any:
        for c in checks[:-1]:
            try:
                return c(value, name)
            except ArgumentError:
                pass
        return checks[-1](value, name)
    return check


def check_values(owner: str, values: dict, specs: dict) -> dict:
    """``values`` (name → value) checked by ``specs`` (name → check), converted; errors name
    ``owner`` and the argument."""
    return {k: (specs[k](v, f"{owner}: {k}") if k in specs else v) for k, v in values.items()}


def checked(**specs: Check) -> Callable[[F], F]:
    """Decorator: the named arguments of each call checked (and converted: paths become
    ``str``) before the function runs."""
    def wrap(func: F) -> F:
        sig = inspect.signature(func)
        owner = f"{func.__name__}()"

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as err:
                raise ArgumentError(f"{owner}: {err}") from None
            bound.arguments.update(check_values(owner, dict(bound.arguments), specs))
            return func(*bound.args, **bound.kwargs)
        return call  # type: ignore[return-value]
    return wrap
