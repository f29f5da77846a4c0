//! CDI spec model and atomic writer.
