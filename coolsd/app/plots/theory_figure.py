"""The theory panel's figure: one round's exact acceptance rates beta_i, TV costs e_i and chance of reaching each
draft position, with omega_i for a rule that has a schedule."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .runs import omega_curve
from .style import EAGLE_COLOR, METHOD_COLOR, fill, figure, layout, legend_below, position_ticks


def theory(table: dict, title: str, *, narrow: bool = False) -> Figure:
    """beta_i, e_i and the chance of reaching position i, with E[N] and the TV bound in the title; omega_i on
    the right when the table gives one (``table["omega"]`` missing or with ``None`` entries: the rule has no
    schedule, e.g. Eagle-1 or LANTERN++, and no omega curve is drawn)."""
    style = layout(narrow)
    fig, (ax,) = figure(style.width, 4.4 if narrow else 3.8)
    fig.suptitle(fill(f"Theory of one round: {title}", style.title, style.width), fontsize=style.title)
    ax.set_title(fill(f"E[N] = {table['expected_accepted']:.3f} accepted drafts per round, "
                      f"TV bound = {table['tv_bound']:.4f}", style.subtitle, style.width), fontsize=style.subtitle)
    x = np.array(table["depth"])
    ax.bar(x - 0.2, table["beta"], width=0.4, color=EAGLE_COLOR, label=r"$\beta_i$: acceptance rate at position $i$")
    ax.bar(x + 0.2, table["cost"], width=0.4, color=METHOD_COLOR, label=r"$e_i$: TV cost of step $i$")
    ax.plot(x, table["reach"], "k.-", label=r"P(reach position $i$)")
    position_ticks(ax.xaxis, x)
    ax.set_xlabel(r"draft position $i$")
    ax.set_ylabel("probability")
    ax.set_ylim(0, 1.05)
    handles = ax.get_legend_handles_labels()[0]
    omegas = table.get("omega")
    if omegas and all(w is not None for w in omegas):
        handles += omega_curve(ax, x, omegas)
    legend_below(fig, handles, ncol=style.columns, size=style.legend)
    return fig
