-- mlp.lua's names -> ft.lua's
return {
  ["fc1.weight"] = "body.0.weight",
  ["fc1.bias"] = "body.0.bias",
  ["fc2.weight"] = {to = "body.1.weight", transpose = true},
  ["fc2.bias"] = "body.1.bias",
  ["head.weight"] = false,
  ["head.bias"] = false,
}
