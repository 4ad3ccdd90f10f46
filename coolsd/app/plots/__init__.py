"""Matplotlib figures of a generation's statistics and of the shipped benchmark (used by the app, and by
``bench --plots``; each figure function returns a Figure), one module per kind of figure:

* :mod:`.style`: what every figure shares: colours, the desktop and phone layouts, a standalone figure and its
  panels, legends below, ticks, text wrapping;
* :mod:`.runs`: one generation's acceptance per draft position and accepted drafts per round;
* :mod:`.cells`: token cells over an image and a Jacobi window's source marks (the maps' and Replay's);
* :mod:`.maps`: the acceptance maps;
* :mod:`.rounds`: Replay's round, on the image and as the tree it drafted;
* :mod:`.theory_figure`: the theory panel's figure;
* :mod:`.labels`: point labels placed clear of each other, and the current setting's star;
* :mod:`.benchmark`: a plain benchmark's quality/speed figure, and the series a benchmark offers;
* :mod:`.study`: the study's quality, speed-up and acceptance panels.

The series' names (``COOL-SD (ν=0.3, linear)``, ``SCD``, ``δ=2``) come from :mod:`coolsd.app.series`. This
package re-exports the figures and what the app's views call as ``plots.X``, with the series key
(:func:`~coolsd.app.series.family`) that ``families=`` and :func:`family_choices` speak.
"""

from ..series import family
from .runs import accepted_lengths, per_position
from .maps import acceptance_map
from .rounds import replay
from .study import (DIFFERENCE_LABELS, panel, panel_title, quietest_measure, study_acceptance, study_difference,
                    study_figures, study_quality, study_speedup)
from .style import SOURCE_STYLE, message
from .theory_figure import theory
from .benchmark import METRIC_LABELS, default_families, family_choices, is_study, tradeoff

__all__ = ["DIFFERENCE_LABELS", "METRIC_LABELS", "SOURCE_STYLE", "acceptance_map", "accepted_lengths",
           "default_families", "family", "family_choices", "is_study", "message", "panel", "panel_title",
           "per_position", "quietest_measure", "replay", "study_acceptance", "study_difference", "study_figures", "study_quality",
           "study_speedup", "theory", "tradeoff"]
