"""What the commands share: absl flags on a FlagValues of their own (flags.py), the training
command's argv (train_command.py), and the platform choice every entry point makes first
(platform.py).
"""
