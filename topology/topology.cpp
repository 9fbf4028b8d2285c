// Placeholder: being written.
namespace moesim::topology {}
