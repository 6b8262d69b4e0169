//! Label selectors (string form and metav1.LabelSelector) and field selectors.
