"""EAGLE head training (scripts/eagle_data.py, scripts/train_eagle.py): chat prompts,
teacher data, training passes."""
