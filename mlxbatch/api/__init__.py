"""The public Python API: `Classifier`, `Prediction`, `evaluate`, and the resolved run spec."""
