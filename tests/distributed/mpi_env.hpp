// The MPI communicator of the job the MPI test binary runs in (made in mpi_main.cpp).
#pragma once

#include <string>

#include "embcache/distributed/mpi_communicator.hpp"

namespace embcache::test {

/// The communicator over MPI_COMM_WORLD.
mpi_communicator& world();

/// A fresh folder every rank of the job shares (rank 0 makes it, the others learn its name),
/// removed with everything in it once every rank has run every test.
/// Collective.
std::string shared_temp_dir(const std::string& tag);

}  // namespace embcache::test
