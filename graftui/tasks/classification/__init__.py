"""Classification: texts (or text pairs) with a label, scored by accuracy, F1 and calibration."""
