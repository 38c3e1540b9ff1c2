"""Planning a run before renting it: the library's train step compiled for a TPU topology
(or this machine), its memory and collectives read from the compiled HLO, and a search
of the batch and config changes that fit."""
