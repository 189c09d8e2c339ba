"""bkref.spec: the executable specification of the BookKeeper ledger protocol.

Dependency direction: spec is pure and stdlib-only; it imports no other package
of bkref, and every other package may read it.

A compiled build of the spec's core modules, when one of exactly this source
exists (`bkref spec build`), is imported in place of the source unless
``BKREF_SPEC=pure`` (``bkref.spec.build``).
"""

from bkref.spec.build import activate as _activate

__path__ = _activate(__path__)
