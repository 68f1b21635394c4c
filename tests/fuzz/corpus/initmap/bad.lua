return {
  ["fc1.weight"] = {too = 1},
  "unterminated
}
