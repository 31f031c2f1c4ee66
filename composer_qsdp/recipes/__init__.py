"""The GPT training harness behind the yaml recipes: models, token data, the recipe loader and the train entrypoint
(``composer -n N -m composer_qsdp.recipes.train RECIPE.yaml``).

The algorithm layers never import this package; it imports them only through the recipe's algorithm names.
"""
