"""Reading a Hugging Face ``config.json``: the file or dict in, and typed access to its keys.

A family's reader (``workbench.models.families``) asks :class:`ConfigReader` for each key it
needs; a missing or ill-typed key is a ValueError naming the key and the family, so a
misread config never becomes a model the refusal rules answer for. The helpers below read
what several families share (the GLU activation, the common geometry, the norm's eps, the
residual multiplier, of which exactly 1 is no scale).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.models.config import MAX_LAYERS

__all__ = ["ConfigReader", "read_config", "glu_act", "common_geometry", "rms_eps", "residual_scale"]


def read_config(path_or_dict: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict)
    if isinstance(path_or_dict, (str, Path)):
        p = Path(path_or_dict)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise ValueError(f"path_or_dict: no config file at {p}")
        try:
            data = json.loads(p.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:  # config.json is UTF-8 by Hugging Face's convention (and JSON's RFC 8259)
            raise ValueError(
                f"path_or_dict: {p} is not UTF-8 text (byte {e.start} is {e.object[e.start]:#04x})"
            ) from None
        except json.JSONDecodeError as e:
            raise ValueError(f"path_or_dict: {p} is not valid JSON ({e})") from None
        except OSError as e:
            raise ValueError(f"path_or_dict: {p} cannot be read ({e.strerror or e})") from None
        if not isinstance(data, dict):
            raise ValueError(f"path_or_dict: {p} holds a {type(data).__name__}, not a JSON object")
        return data
    raise ValueError(f"path_or_dict: must be a path (str or Path) or a dict, got {type(path_or_dict).__name__}")


_TYPE_NAMES = {int: "an int", float: "a number", str: "a string", list: "a list", bool: "a bool", dict: "an object"}


class ConfigReader:
    """Typed access to one config dict, naming the key and the family in every error.

    ``scope`` is the dict read from (Qwen3.5 and Gemma 3 multimodal configs nest the
    text model under ``text_config``).
    """

    def __init__(self, raw: dict[str, Any], family: str, scope: dict[str, Any] | None = None):
        self.raw = raw
        self.family = family
        self.scope = raw if scope is None else scope

    def nested(self, key: str) -> ConfigReader:
        """Read from ``key`` (a sub-object) when present, else from the top level."""
        sub = self.scope.get(key)
        if sub is None:
            return self
        if not isinstance(sub, dict):
            raise ValueError(f"{key}: must be an object in a {self.family} config, got {type(sub).__name__}")
        return ConfigReader(self.raw, self.family, sub)

    def has(self, key: str) -> bool:
        return self.scope.get(key) is not None

    def _check(self, key: str, value: Any, typ: type) -> Any:
        ok = isinstance(value, typ) and not (typ in (int, float) and isinstance(value, bool))
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            raise ValueError(
                f"{key}: must be {_TYPE_NAMES.get(typ, typ.__name__)} in a {self.family} config, "
                f"got {type(value).__name__} {value!r}"
            )
        if typ is float and not math.isfinite(value):
            raise ValueError(f"{key}: must be a finite number in a {self.family} config, got {value!r}")
        return value

    def count(self, key: str, default: int) -> int:
        """An optional count (experts, ...): an int >= 0."""
        v = self.opt(key, int, default)
        if v < 0:
            raise ValueError(f"{key}: must be >= 0 in a {self.family} config, got {v}")
        return v

    def int_list(self, key: str, n: int) -> list[int]:
        """An optional list of layer indices, each an int in 0..n-1 (``mlp_only_layers``)."""
        v = self.opt(key, list, [])
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < n:
                raise ValueError(
                    f"{key}[{i}]: must be a layer index, an int in 0..{n - 1}, in a {self.family} config, "
                    f"got {type(x).__name__} {x!r}"
                )
        return v

    def offset(self, key: str, period: int, period_key: str) -> int:
        """A layer offset within a period: an int in 0..period-1 (else no layer would match)."""
        v = self.req(key, int)
        if not 0 <= v < period:
            raise ValueError(
                f"{key}: must be in 0..{period - 1} ({period_key} is {period}) in a {self.family} config, got {v}; "
                f"any other offset matches no layer"
            )
        return v

    def req(self, key: str, typ: type) -> Any:
        if key not in self.scope or self.scope[key] is None:
            raise ValueError(f"{key}: missing, and a {self.family} config needs it")
        return self._check(key, self.scope[key], typ)

    def opt(self, key: str, typ: type, default: Any) -> Any:
        if key not in self.scope or self.scope[key] is None:
            return default
        return self._check(key, self.scope[key], typ)

    def positive(self, key: str) -> int:
        v = self.req(key, int)
        if v <= 0:
            raise ValueError(f"{key}: must be positive in a {self.family} config, got {v}")
        return v

    def num_layers(self) -> int:
        """``num_hidden_layers``: positive and at most :data:`MAX_LAYERS`, checked before any layer is built."""
        n = self.positive("num_hidden_layers")
        if n > MAX_LAYERS:
            raise ValueError(f"num_hidden_layers: must be at most {MAX_LAYERS} in a {self.family} config, got {n}")
        return n

    def first(self, keys: tuple[str, ...], typ: type) -> Any:
        """The first of ``keys`` present (families spell one thing several ways)."""
        for k in keys:
            if self.has(k):
                return self.req(k, typ)
        raise ValueError(
            f"{keys[0]}: missing (also looked for {', '.join(keys[1:])}), and a {self.family} config needs it"
        )

    def head_dim(self, heads: int, hidden: int, keys: tuple[str, ...] = ("head_dim",)) -> int:
        for k in keys:
            if self.has(k):
                v = self.req(k, int)
                if v <= 0:
                    raise ValueError(f"{k}: must be positive in a {self.family} config, got {v}")
                return v
        if heads <= 0:  # hidden // heads below would divide by zero
            raise ValueError(f"num_attention_heads: must be positive in a {self.family} config, got {heads}")
        if hidden % heads:
            raise ValueError(
                f"head_dim: missing, and hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {heads} in this {self.family} config"
            )
        return hidden // heads

    def str_list(self, key: str, n: int, allowed: tuple[str, ...]) -> list[str]:
        v = self.req(key, list)
        if len(v) != n:
            raise ValueError(f"{key}: must have num_hidden_layers={n} entries in a {self.family} config, got {len(v)}")
        for i, s in enumerate(v):
            if s not in allowed:
                raise ValueError(f"{key}[{i}]: must be one of {allowed} in a {self.family} config, got {s!r}")
        return v


def glu_act(r: ConfigReader, keys: tuple[str, ...] = ("hidden_act",), default: str | None = None) -> str:
    """The FFN's GLU activation name from the config's activation key."""
    act = None
    for k in keys:
        if r.has(k):
            act = r.req(k, str)
            break
    if act is None:
        if default is None:
            raise ValueError(f"{keys[0]}: missing, and a {r.family} config needs it")
        act = default
    return {
        "silu": "swiglu",
        "swish": "swiglu",
        "gelu_pytorch_tanh": "geglu",
        "gelu": "geglu",
        "gelu_new": "geglu",
        "relu2": "relu2",
    }.get(act, act)


def common_geometry(r: ConfigReader) -> tuple[int, int, int, int, int, float]:
    hidden = r.positive("hidden_size")
    n = r.num_layers()
    q = r.positive("num_attention_heads")
    kv = r.opt("num_key_value_heads", int, q)  # absent = multi-head, as transformers reads it
    if kv <= 0:
        raise ValueError(f"num_key_value_heads: must be positive in a {r.family} config, got {kv}")
    if q % kv:
        raise ValueError(
            f"num_attention_heads: must be a multiple of num_key_value_heads ({kv}) in a {r.family} config, got {q}"
        )
    eps = rms_eps(r)
    hd = r.head_dim(q, hidden)
    return hidden, n, q, kv, hd, eps


def rms_eps(r: ConfigReader) -> float:
    """The norm's epsilon: a finite number > 0 (0 divides by zero on a zero row; < 0 takes a root of a negative)."""
    eps = r.first(("rms_norm_eps", "layer_norm_epsilon"), float)
    if not eps > 0:
        raise ValueError(f"rms_norm_eps: must be a finite number > 0 in a {r.family} config, got {eps!r}")
    return eps


def residual_scale(r: ConfigReader) -> float | None:
    v = r.opt("residual_multiplier", float, None)
    return None if v is None or v == 1.0 else v
