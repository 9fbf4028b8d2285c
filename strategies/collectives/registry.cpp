// Placeholder: being written.
namespace moesim::collectives {}
