//! The validation and trace layer's integration tests, one binary (one link): the allocator's
//! checks, the planted misuses and the timeline.

mod allocator;
mod planted;
mod trace;
