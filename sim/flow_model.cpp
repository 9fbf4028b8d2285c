// Placeholder: being written.
namespace moesim::sim {}
