"""Which run `rlscale export --study` writes (study.py). The recipe -> framework mappings live beside the recipe, in
rlscale.planner.frameworks, where the engines read them too."""
