"""Pipelined verl V1 trainers (minibatch_pipeline, one_off_pipeline). Installed as ``verl_pipe.trainers``."""
