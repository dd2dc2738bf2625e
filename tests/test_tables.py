"""Terminal tables that fit the width: ids whole, free text cut, optional columns left out."""

from __future__ import annotations

import io

from rich.console import Console
from rich.text import Text

from sweepkit.screen import GAP, LAST_RESORT_FLOOR, Column, fit_widths, print_table

COLUMNS = [Column(header="cell"), Column(header="status"), Column(header="job", floor=8, drop=1),
           Column(header="reward", justify="right", drop=2), Column(header="failure", floor=12)]
NATURAL = [30, 6, 20, 6, 50]


def total(widths: dict[int, int]) -> int:
    return sum(widths.values()) + GAP * (len(widths) - 1)


def test_everything_whole_when_it_fits():
    assert fit_widths(COLUMNS, NATURAL, 200) == dict(enumerate(NATURAL))


def test_text_is_cut_before_any_column_is_left_out():
    widths = fit_widths(COLUMNS, NATURAL, 100)
    assert sorted(widths) == [0, 1, 2, 3, 4] and total(widths) == 100
    assert widths[0] == 30 and widths[1] == 6 and widths[3] == 6  # ids, states, numbers whole
    assert widths[2] >= 8 and widths[4] >= 12


def test_optional_columns_go_lowest_first_and_come_back_when_a_later_drop_made_room():
    widths = fit_widths(COLUMNS, NATURAL, 60)  # 30+6+8+6+12 + 8 gaps = 70: the job goes
    assert sorted(widths) == [0, 1, 3, 4] and total(widths) <= 60
    reward_first = [Column(header=c.header, justify=c.justify, floor=c.floor,
                           drop={"reward": 1, "job": 2}.get(c.header)) for c in COLUMNS]
    # Without the reward 62 > 61: the job goes too (52); then the reward fits again (60).
    widths = fit_widths(reward_first, NATURAL, 61)
    assert sorted(widths) == [0, 1, 3, 4] and total(widths) <= 61


def test_the_last_resort_cuts_text_below_its_floor_and_never_cuts_an_id():
    widths = fit_widths(COLUMNS, NATURAL, 44)  # 30+6 + 2 gaps leaves 4 for the failure
    assert sorted(widths) == [0, 1, 4]
    assert widths[0] == 30 and widths[4] == LAST_RESORT_FLOOR  # wider than 44: the terminal wraps


def test_printed_rows_fit_and_cut_text_ends_in_an_ellipsis():
    out = io.StringIO()
    console = Console(file=out, width=70, color_system=None)
    rows = [[Text("grids/a_long_grid_name.py::cell_x"), Text("FAILED"), Text("slurm:1234567_12"), Text("0.5"),
             Text("EXCEPTION: RuntimeError: a long message that cannot fit here")]]
    dropped = print_table(console, COLUMNS, rows, title="t")
    lines = out.getvalue().splitlines()
    assert lines[0] == "t" and dropped == ["job"]
    assert all(len(line) <= 70 for line in lines), lines
    assert lines[2].startswith("grids/a_long_grid_name.py::cell_x  FAILED") and lines[2].rstrip().endswith("…")
