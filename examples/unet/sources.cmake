# train_unet's sources, relative to examples/unet. examples/CMakeLists.txt builds them in the
# dlrun tree; the wheel ships them with examples/unet/CMakeLists.txt, which builds train_unet
# against the wheel's dlrun::worker where only Python, torch, CMake and a compiler are
# (docs/PACKAGING.md, "train_unet from the wheel").
# The YAML configurations: no LibTorch (unit tests and a fuzz target use them alone).
set(DLRUN_UNET_CONFIG_SOURCES config.cc)
# The model, the trainer and its data (data_hdf5.cc: the HDF5 files, optional outside the tree).
set(DLRUN_UNET_SOURCES unet.cc trainer.cc trainer_step.cc batch_feed.cc train_args.cc data.cc data_hdf5.cc
  tools.cc tensorboard.cc gpu.cc)
