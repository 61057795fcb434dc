"""A ``sitecustomize.py`` that changes one method in the generator processes of a
disaggregated run, for tests that need a slow or broken generator without a fault hook in
the product: a generator process is spawned by the learner and has no ``RANK`` (the
learner's ranks have one), so only there ``wrap(real)`` replaces ``cls.method`` of ``module``
when that module is first imported. The ``sitecustomize`` this one hides on the path, if
any, runs after it."""

TEMPLATE = """
import importlib.abc, importlib.machinery, importlib.util, os, sys

{wrapper}


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != {module!r} or "RANK" in os.environ:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            owner = getattr(module, {cls!r})
            setattr(owner, {method!r}, wrap(getattr(owner, {method!r})))

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Patch())
here = os.path.dirname(os.path.abspath(__file__))
other = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
)
if other is not None:
    other.loader.exec_module(importlib.util.module_from_spec(other))
"""


def sitecustomize(module: str, cls: str, method: str, wrapper: str) -> str:
    """The file's text; ``wrapper`` is source defining ``wrap(real)``, which returns the
    replacement of ``module.cls.method``."""
    return TEMPLATE.format(module=module, cls=cls, method=method, wrapper=wrapper)
