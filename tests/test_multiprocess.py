"""The 2-process tests' output filter (tools/multiprocess.own_lines): Gloo's connection
messages, however its threads interleave them, are not a process's own lines."""

from tools import multiprocess

MSG = "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"


def test_gloo_messages_and_their_fragments_are_not_own_lines():
  # Two threads' messages on one line leave the second newline as an empty line;
  # a message split after "[Gloo] Rank " leaves the rest on a line of its own.
  out = "\n".join([MSG, MSG + MSG, "", "[Gloo] Rank ", MSG[len("[Gloo] Rank "):], "  "])
  assert multiprocess.own_lines(out) == []


def test_a_process_s_own_lines_are_kept_in_order():
  out = "\n".join([MSG, "step 10: loss 7.1", "", MSG, "error: --task: no such directory"])
  assert multiprocess.own_lines(out) == ["step 10: loss 7.1", "error: --task: no such directory"]
