"""The threading auto-tuner (μTune): train a load -> (model, pool sizes) decision table."""
