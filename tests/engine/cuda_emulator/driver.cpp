// libcuda.so.1 for the emulated backend: the backend checks that the driver library loads before
// it asks the runtime for devices (see ProbeDevices); the emulated runtime needs nothing from it.
extern "C" __attribute__((visibility("default"))) int orochi_cuda_emulator_driver() { return 0; }
