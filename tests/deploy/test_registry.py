"""The one registry helper (nestflex.deploy._registry) and the four registries built on it."""

import pytest
import torch

from nestflex.deploy._registry import Registry
from nestflex.deploy.codec import CodecError, RawCodec, get_codec, list_codecs
from nestflex.deploy.exits import ExitError, get_confidence, list_confidences, register_confidence
from nestflex.deploy.scheduler import GreedyScheduler, SchedulerError, get_scheduler, list_schedulers
from nestflex.errors import NestflexError
from nestflex.exits.heads import get_head, list_heads, register_head


class ColourError(NestflexError, ValueError):
    pass


def test_register_get_list_and_decorator():
    reg = Registry("colour", ColourError, register_hint="register it first")
    red = reg.register("red", lambda: "red")
    assert reg.get("red") is red

    @reg.register("blue")
    def blue():
        return "blue"

    assert reg.names() == ["blue", "red"] == list(reg) and len(reg) == 2 and "blue" in reg
    assert reg.get("blue") is blue and repr(reg) == "Registry('colour', ['blue', 'red'])"


def test_taken_names_need_overwrite():
    reg = Registry("colour", ColourError)
    reg.register("red", str)
    with pytest.raises(ColourError, match="colour `red` is already registered. HINT: pass overwrite=True"):
        reg.register("red", repr)
    reg.register("red", repr, overwrite=True)
    assert reg.get("red") is repr


@pytest.mark.parametrize("name", ["", None, 3])
def test_names_must_be_non_empty_strings(name):
    with pytest.raises(ColourError, match=r"colour `name` must be a non-empty string, got"):
        Registry("colour", ColourError).register(name, str)


def test_entries_must_be_callable_unless_objects_are_stored():
    with pytest.raises(ColourError, match=r"colour 'red' must be callable, got int\."):
        Registry("colour", ColourError).register("red", 3)
    assert Registry("colour", ColourError, callable_entries=False).register("red", 3) == 3


def test_unknown_names_list_the_known_ones_with_a_hint():
    reg = Registry("colour", ColourError, register_hint="register it first")
    reg.register("green", str)
    reg.register("red", str)
    with pytest.raises(ColourError, match=r"^unknown colour `gren`; choose from: green, red. HINT: did you mean `green`\?$"):
        reg.get("gren")
    with pytest.raises(ColourError, match=r"^unknown colour `blue`; choose from: green, red. HINT: register it first$"):
        reg.get("blue")
    with pytest.raises(ColourError, match=r"unknown colour `7`"):
        reg.get(7)
    assert isinstance(reg.unknown("x"), ColourError)


def test_accepted_objects_pass_through_and_templates_apply():
    reg = Registry("colour", ColourError, accepts=lambda c: isinstance(c, tuple),
                   unknown="no {kind} {name!r} in {known}: {hint}", taken="{name!r} again")
    reg.register("red", str)
    assert reg.get((1, 2)) == (1, 2)
    with pytest.raises(ColourError, match=r"^no colour 'blue' in \['red'\]: register your own first$"):
        reg.get("blue")
    with pytest.raises(ColourError, match=r"^'red' again$"):
        reg.register("red", str)


# Every registry on the helper: its listing is sorted, an object passes through, and an unknown
# name raises the package's error naming the kind, the bad name and the known names, with a HINT.
REGISTRIES = {
    "codec": (list_codecs, get_codec, RawCodec(), CodecError, r"unknown codec 'nope'; known codecs: \[.*'raw'.*\]\. HINT"),
    "scheduler": (list_schedulers, get_scheduler, GreedyScheduler("total"), SchedulerError,
                  r"unknown scheduler 'nope'; known: \[.*'knee'.*\]\. HINT"),
    "confidence": (list_confidences, get_confidence, torch.sigmoid, ExitError,
                   r"unknown confidence measure `nope`; choose from: .*max_prob.*\. HINT"),
    "head": (list_heads, get_head, torch.nn.Identity, ExitError, r"unknown exit head `nope`; choose from: .*sdn.*\. HINT"),
}


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_every_registry_lists_gets_and_explains(kind):
    list_fn, get_fn, obj, error, match = REGISTRIES[kind]
    names = list_fn()
    assert names == sorted(names) and len(names) >= 2
    assert get_fn(obj) is obj
    got = get_fn(names[0])
    assert got is not None
    with pytest.raises(error, match=match):
        get_fn("nope")
    assert issubclass(error, NestflexError)


def test_decorator_registries_take_overwrite(monkeypatch):
    import nestflex.deploy.exits as exits_module
    import nestflex.exits.heads as heads_module

    # registries are global: work on copies so other tests' pinned name lists stay as they are
    for reg in (exits_module._CONFIDENCES, heads_module._HEADS):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    fn = register_confidence("test_registry_margin")(lambda logits: logits.softmax(-1).amax(-1))
    with pytest.raises(ExitError, match="confidence measure `test_registry_margin` is already registered"):
        register_confidence("test_registry_margin")(fn)
    again = register_confidence("test_registry_margin", overwrite=True)(lambda logits: logits[:, 0])
    assert get_confidence("test_registry_margin") is again
    head = register_head("test_registry_head", overwrite=True)(lambda in_shape, n: torch.nn.Flatten())
    assert get_head("test_registry_head") is head
