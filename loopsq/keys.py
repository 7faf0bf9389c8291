"""Every Redis key name loopsq uses, in one place.

Keys live under a namespace (default ``loopsq``) so that one Redis can host several deployments. Nothing else in
the code base spells a key.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_NAMESPACE = "loopsq"


@dataclass(frozen=True)
class Keys:
    """Key names under one namespace."""

    namespace: str = DEFAULT_NAMESPACE

    def _k(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))

    # -- deployment -------------------------------------------------------------------------------------------
    @property
    def instance(self) -> str:
        """String: random id of this Redis dataset; a mirror that sees it change rebuilds."""
        return self._k("instance")

    @property
    def changes(self) -> str:
        """Stream: the single change stream; one entry per state transition."""
        return self._k("changes")

    # -- loops ------------------------------------------------------------------------------------------------
    def loop(self, loop_id: str) -> str:
        """String: a loop's JSON (camelCase)."""
        return self._k("loop", loop_id)

    @property
    def loops(self) -> str:
        """Set: ids of every loop."""
        return self._k("loops")

    @property
    def loop_names(self) -> str:
        """Hash: loop name -> id (loop names are unique in loopsq)."""
        return self._k("loop-names")

    # -- workflow specs -------------------------------------------------------------------------------------------
    def workflow(self, workflow_id: str) -> str:
        """String: a workflow spec's JSON."""
        return self._k("workflow", workflow_id)

    @property
    def workflows(self) -> str:
        """Set: ids of every workflow spec, active or archived."""
        return self._k("workflows")

    @property
    def workflow_names(self) -> str:
        """Hash: active workflow name -> id (active names are unique, as in the reference)."""
        return self._k("workflow-names")
