-- config{} keys are names that --set can name
local x = input("x", {4, 8})
local cfg = config{[1] = 2} -- ERROR
