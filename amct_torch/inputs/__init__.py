"""Calibration inputs: what a user has (image folders, .npy/.npz arrays, tensors, iterables)
decoded and preprocessed the Caffe way into the batches the model takes."""
