"""The 2-process tests' output filter (tests/multiprocess_runs.own_lines): Gloo's connection
messages, however its threads interleave them, are not a process's own lines."""

import multiprocess_runs as multiprocess

MSG = "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"


def test_gloo_messages_and_their_pieces_are_not_own_lines():
  # Gloo writes its message piece by piece from unsynchronised threads: two messages on
  # one line leave the second line end as an empty line, and a message can be cut after
  # any piece, leaving the rest (or the number alone) on a line of its own.
  cuts = [MSG.index(p) for p in (" is connected", "1 peer", " peer ranks", "Expected")]
  pieces = [x for c in cuts for x in (MSG[:c], MSG[c:])] + [MSG[-1]]
  out = "\n".join([MSG, MSG + MSG, "", *pieces, "  ", "[Gloo] Rank 0 is connected" + MSG])
  assert multiprocess.own_lines(out) == []


def test_a_process_s_own_lines_are_kept_in_order():
  out = "\n".join([MSG, "step 10: loss 7.1", "", MSG, "error: --task: no such directory"])
  assert multiprocess.own_lines(out) == ["step 10: loss 7.1", "error: --task: no such directory"]
