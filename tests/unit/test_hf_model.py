"""Typed access to a Hugging Face model (engine/hf_model.py): through DDP's ``.module`` and
peft's ``get_base_model()``, and one line naming the class of a module that is not one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from areal_m2po.engine.hf_model import (
    as_peft,
    as_pretrained,
    base_model,
    model_config,
    output_embeddings,
)


class Body(torch.nn.Module):
    """Stands in for a PreTrainedModel: a config, save_pretrained, an output embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(num_hidden_layers=3)
        self.head = torch.nn.Linear(2, 2)

    def save_pretrained(self, path: str, **kwargs: object) -> None:
        pass

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head


class Adapter(torch.nn.Module):
    """Stands in for a PeftModel around ``body``."""

    def __init__(self, body: torch.nn.Module) -> None:
        super().__init__()
        self.base = body

    def get_base_model(self) -> torch.nn.Module:
        return self.base


class Wrapper(torch.nn.Module):
    """Stands in for DDP: the model in ``.module``."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


def test_base_model_and_config_through_both_wrappers():
    body = Body()
    for model in (body, Wrapper(body), Adapter(body), Wrapper(Adapter(body))):
        assert base_model(model) is body
        assert model_config(model).num_hidden_layers == 3
    assert as_peft(body) is None and as_peft(Wrapper(body)) is None
    adapter = Adapter(body)
    assert as_peft(Wrapper(adapter)) is adapter


def test_a_module_that_is_not_a_hugging_face_model_is_named():
    plain = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="^Linear is not a Hugging Face model"):
        as_pretrained(plain)
    with pytest.raises(TypeError, match="^Linear has no config"):
        model_config(plain)
    assert as_pretrained(Body()) is not None
    assert output_embeddings(plain) is None
    body = Body()
    assert output_embeddings(body) is body.head
