"""caffe"""
