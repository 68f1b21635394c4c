return {
  fc1 = "y",
  ["a b"] = false,
  ['x'] = {to = "z", transpose = true},
  ["\"q\""] = "w",
}
