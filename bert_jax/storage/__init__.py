"""Where bytes live: one file layer for local paths and `gs://` buckets (fs.py). The
bottom of the folder order, so every folder can read and write through it."""
