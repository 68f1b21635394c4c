-- calling a function that does not exist
local x = input("x", {4, 8})
local function block(h)
  return undefined_layer(h) -- ERROR
end
minimize(block(x):sum())
