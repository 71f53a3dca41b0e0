"""`experiments.generate`: what a preset does to text.

* `compare`: cache kinds, greedy continuations, first divergence.
* `report`: the text of one prompt's comparison.
* `runner`: reads and encodes the prompts, runs every kind, prints.
"""
