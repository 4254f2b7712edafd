"""``CompareView``: a notebook view of :func:`~boxmaker.batch.compare`'s table, with the
success-versus-cost plot and a choice of the cost on its x axis (ipywidgets, loaded when a view
is made)."""

from __future__ import annotations

import base64
import html
import io
from typing import TYPE_CHECKING, Any

from ._compare import COST_COLUMNS, format_compare, success_vs_cost

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CompareView"]


class CompareView:
    """A table of the settings (success with its interval, difference to the baseline, costs)
    and the success-versus-cost plot; a dropdown picks the cost (any :data:`COST_COLUMNS` or
    ``<kind>_hits`` column the table has). Display ``view.widget`` (or the view itself as the
    last expression of a cell). Every text of the table is escaped (settings come from files).

    Args:
        table: a frame from :func:`~boxmaker.batch.compare`.
        cost: the cost first shown on the x axis.

    Raises:
        ConfigError: ``cost`` is not a column of ``table``.
    """

    def __init__(self, table: pd.DataFrame, cost: str = "prefill_ms") -> None:
        import ipywidgets as widgets  # the kernel-side library, only when a view is made

        self.table = table
        costs = [c for c in table.columns if c in COST_COLUMNS or c.endswith("_hits")]
        self._pick = widgets.Dropdown(options=costs, value=cost, description="cost")
        self._plot = widgets.HTML()
        self._text = widgets.HTML(
            "<pre style='font-size:11px'>" + html.escape(format_compare(table)) + "</pre>"
        )
        self._pick.observe(lambda change: self.draw(change["new"]), names="value")
        self.widget = widgets.VBox([self._text, self._pick, self._plot])
        self.draw(cost)

    def draw(self, cost: str) -> None:
        """Draw the plot against ``cost`` (a PNG in the view)."""
        figure = success_vs_cost(self.table, cost)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=90)
        data = base64.b64encode(buffer.getvalue()).decode()
        self._plot.value = (
            f"<img alt='success vs {html.escape(cost)}' src='data:image/png;base64,{data}'>"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """Jupyter shows the view as its widget."""
        return self.widget._repr_mimebundle_(**kwargs)
