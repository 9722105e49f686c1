"""Every public name of qatgraph.nn, and every public method, property and enum value of its
classes, says what it is; so does every public name of the package itself, and of
qatgraph.torch where torch is installed."""
import dataclasses
import enum
import importlib.util

import qatgraph as qg


def has_doc(obj):
    doc = (getattr(obj, "__doc__", None) or "").strip()
    if not doc:
        return False
    # nanobind gives every function and property a first line with its signature ("f(x: int)
    # -> int", "(self) -> int"): a docstring is a line more.
    lines = doc.splitlines()
    generated = not isinstance(obj, type) and "(" in lines[0] and "->" in lines[0]
    return len(lines) > 1 if generated else True


def member_docs(cls):
    """(qualified name, documented) of the public members a class defines itself."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if name in _dataclass_fields(cls):
            # A dataclass field with a default is a class attribute holding that default: the
            # class docstring documents the field ("name: what it is").
            out.append((f"{cls.__name__}.{name}", f"{name}:" in (cls.__doc__ or "")))
        elif isinstance(value, enum.Enum) or isinstance(value, cls):  # an enum value
            out.append((f"{cls.__name__}.{name}", _enum_value_documented(cls, name)))
        else:
            out.append((f"{cls.__name__}.{name}", has_doc(value)))
    return out


def _dataclass_fields(cls):
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


def _enum_value_documented(cls, name):
    # nanobind enums keep each value's docstring in the value's own __doc__.
    value = getattr(cls, name)
    return bool((value.__doc__ or "").strip()) and value.__doc__ != cls.__doc__


def undocumented(module):
    missing = [n for n in module.__all__ if not has_doc(getattr(module, n))]
    for n in module.__all__:
        obj = getattr(module, n)
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            missing += [name for name, ok in member_docs(obj) if not ok]
    return sorted(missing)


def test_every_public_name_of_nn_has_a_docstring():
    assert len(qg.nn.__all__) > 30
    assert undocumented(qg.nn) == []


def test_every_public_name_of_the_package_has_a_docstring():
    assert undocumented(qg) == []


def test_every_public_name_of_qatgraph_torch_has_a_docstring():
    if importlib.util.find_spec("torch") is None:
        import pytest
        pytest.skip("torch is not installed")
    import qatgraph.torch as qgt
    assert {"prepare_qat", "convert", "Recipe", "QATConvBn2d"} <= set(qgt.__all__)
    assert undocumented(qgt) == []
