"""composer_qsdp: quantized FSDP communication (QSDP) for MosaicML Composer."""

__version__ = "0.1.0"
