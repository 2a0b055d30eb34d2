from jinja2.runtime import LoopContext, Macro, Markup, Namespace, TemplateNotFound, TemplateReference, TemplateRuntimeError, Undefined, escape, identity, internalcode, markup_join, missing, str_join
name = 'configmap.yaml.j2'

def root(context, missing=missing):
    resolve = context.resolve_or_missing
    undefined = environment.undefined
    concat = environment.concat
    cond_expr_undefined = Undefined
    if 0: yield None
    l_0_config_map = resolve('config_map')
    l_0_parts = missing
    try:
        t_1 = environment.filters['indent']
    except KeyError:
        @internalcode
        def t_1(*unused):
            raise TemplateRuntimeError("No filter named 'indent' found.")
    try:
        t_2 = environment.filters['tojson']
    except KeyError:
        @internalcode
        def t_2(*unused):
            raise TemplateRuntimeError("No filter named 'tojson' found.")
    pass
    l_0_parts = context.vars['parts'] = environment.get_template('parts.j2', 'configmap.yaml.j2')._get_default_module(context)
    context.exported_vars.discard('parts')
    yield 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  '
    yield str(t_1(context.call(environment.getattr((undefined(name='parts') if l_0_parts is missing else l_0_parts), 'metadata'), environment.getattr((undefined(name='config_map') if l_0_config_map is missing else l_0_config_map), 'metadata')), 2))
    yield '\ndata:\n  '
    yield str(t_2(environment.getattr((undefined(name='config_map') if l_0_config_map is missing else l_0_config_map), 'key')))
    yield ': '
    yield str(t_2(environment.getattr((undefined(name='config_map') if l_0_config_map is missing else l_0_config_map), 'train_json')))
    yield '\n'

blocks = {}
debug_info = '6=25&10=28&12=30'