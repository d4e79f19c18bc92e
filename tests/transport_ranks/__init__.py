"""Programs that run as real ranks (under mpiexec or torch.multiprocessing) for the transport tests."""
