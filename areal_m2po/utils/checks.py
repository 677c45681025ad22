"""Transitional: the argument checks moved to :mod:`areal_m2po.algo.checks`.

Only :mod:`areal_m2po.utils.logprobs` imports this path (another branch edits that file while
the maths moves); once both are merged, its import becomes ``areal_m2po.algo.checks`` and this
module is deleted. Nothing else may import it.
"""

from __future__ import annotations

from areal_m2po.algo.checks import check_real, check_tensor

__all__ = ["check_real", "check_tensor"]
