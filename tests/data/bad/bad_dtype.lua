-- an unknown dtype name
local x = input("x", {4, 8}, "float32") -- ERROR
minimize(x:sum())
