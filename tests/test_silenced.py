"""mate_cli/silenced.py: the warnings it filters are filtered, with a reason each; any other warning still shows."""

from __future__ import annotations

import warnings

from mate_cli.silenced import SILENCED, silence


def test_each_silenced_warning_is_filtered_and_others_still_show():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        silence()
        for entry in SILENCED:
            assert entry.why
            text = entry.message.replace("\\", "") + " (and the rest of the message)"
            warnings.warn_explicit(text, UserWarning, "x.py", 1, module=entry.module.replace("\\", "") or "anywhere")
        warnings.warn("something mate does not understand", UserWarning)
    assert [str(w.message) for w in seen] == ["something mate does not understand"]
