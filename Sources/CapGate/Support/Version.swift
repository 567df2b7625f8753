public enum CapGateVersion { public static let string = "0.1.0" }
