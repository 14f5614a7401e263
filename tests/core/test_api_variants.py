"""Each collective's variants (blocking, ``_async``, in place ``_``, grouped) against its one description in
``commlib.api.COLLECTIVES``: every variant exists and is re-exported by ``commlib``, takes exactly the
described arguments with the described defaults, and hands every one of them, in order, to the
collective's one implementation with its own form. So adding an argument to a collective means adding it to
the description, and a variant that forgets it fails here."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

import commlib
from commlib import api

CASES = [(collective, variant, form, grouped)
         for collective in api.COLLECTIVES
         for variant, (form, grouped) in collective.variants().items()]
IDS = [variant for _, variant, _, _ in CASES]


def _form_name(form) -> str:
    """The module constant that holds ``form`` (``_ASYNC``, ``_BLOCKING_``, ...)."""
    (name,) = [n for n in ("_ASYNC", "_ASYNC_", "_BLOCKING", "_BLOCKING_") if getattr(api, n) == form]
    return name


@pytest.mark.parametrize("collective, variant, form, grouped", CASES, ids=IDS)
def test_each_variant_takes_the_described_arguments(collective, variant, form, grouped):
    function = getattr(api, variant)
    assert getattr(commlib, variant) is function, f"commlib does not re-export api.{variant}"
    assert function.__doc__, f"{variant} has no docstring"
    parameters = list(inspect.signature(function).parameters.values())
    first = "tensors" if grouped else "tensor"
    assert parameters[0].name == first and parameters[0].default is inspect.Parameter.empty, variant
    got = [(p.name, p.default) for p in parameters[1:]]
    assert [name for name, _ in got] == list(collective.argument_names), variant
    for (name, default), (_, described) in zip(got, collective.arguments):
        assert default is described or default == described, f"{variant}: {name}={default!r}, described {described!r}"
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters), variant


@pytest.mark.parametrize("collective, variant, form, grouped", CASES, ids=IDS)
def test_each_variant_passes_every_argument_to_the_one_implementation(collective, variant, form, grouped):
    """The body is one ``return``: run(FORM, tensor, *arguments) or _grouped(FORM, COLLECTIVE, tensors, ...)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(api, variant))))
    body = tree.body[0].body
    statements = body[1:] if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else body
    assert len(statements) == 1 and isinstance(statements[0], ast.Return), f"{variant}: not one return"
    call = statements[0].value
    assert isinstance(call, ast.Call) and not call.keywords, f"{variant}: not one positional call"
    names = [arg.id if isinstance(arg, ast.Name) else None for arg in call.args]
    expected = [_form_name(form)]
    if grouped:
        assert call.func.id == "_grouped", variant
        expected.append(next(name for name, value in vars(api).items() if value is collective))
        expected.append("tensors")
    else:
        assert call.func.id == collective.run.__name__, variant
        expected.append("tensor")
    assert names == expected + list(collective.argument_names), f"{variant}: passes {names}"


@pytest.mark.parametrize("collective", api.COLLECTIVES, ids=[c.name for c in api.COLLECTIVES])
def test_each_implementation_takes_the_description(collective):
    parameters = list(inspect.signature(collective.run).parameters)
    assert parameters == ["form", "tensor", *collective.argument_names]


def test_no_variant_outside_the_description():
    """Every public function named like a collective's variant is one the table describes."""
    described = {variant for _, variant, _, _ in CASES}
    bases = {c.name for c in api.COLLECTIVES}
    public = {name for name, value in vars(api).items()
              if inspect.isfunction(value) and value.__module__ == api.__name__ and not name.startswith("_")}
    shaped = {name for name in public
              if name.removeprefix("grouped_").removesuffix("_").removesuffix("_async") in bases}
    assert shaped == described


def test_the_allreduces_take_a_priority():
    """allreduce, allreduce_ and grouped_allreduce_async take ``priority`` as their siblings do."""
    for name in ("allreduce", "allreduce_", "grouped_allreduce_async", "grouped_allreduce",
                 "grouped_allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce_async_"):
        assert inspect.signature(getattr(commlib, name)).parameters["priority"].default == 0, name

